"""Each rank reads only its slices of the checkpoint, each once, not whole tensors.

What is counted is what safetensors hands out (`get_tensor`, and `get_slice(...)[...]`,
which copies only the slice's bytes out of the memory map): the bytes every rank reads
add up to the checkpoint once, plus the replicated tensors (norms) once more per extra rank.
"""

from __future__ import annotations

import collections
import json
import struct
from pathlib import Path

import pytest
import torch
from tiny_model import make_tiny_llama
from tp_ranks import single

from sluice.runtime.model.loader import load_model

KV_HEADS = 2


class ReadLog:
    def __init__(self) -> None:
        self.bytes = 0
        self.names: collections.Counter[str] = collections.Counter()
        self.whole: set[str] = set()

    def add(self, name: str, tensor: torch.Tensor, whole: bool) -> None:
        self.bytes += tensor.numel() * tensor.element_size()
        self.names[name] += 1
        if whole:
            self.whole.add(name)


def counting_safe_open(log: ReadLog, real):  # type: ignore[no-untyped-def]
    class Slice:
        def __init__(self, name: str, inner) -> None:  # type: ignore[no-untyped-def]
            self.name, self.inner = name, inner

        def get_shape(self):  # type: ignore[no-untyped-def]
            return self.inner.get_shape()

        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            tensor = self.inner[index]
            log.add(self.name, tensor, whole=False)
            return tensor

    class Handle:
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            self.inner = real(*args, **kwargs)

        def __enter__(self):  # type: ignore[no-untyped-def]
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            return self.inner.__exit__(*exc)

        def keys(self):  # type: ignore[no-untyped-def]
            return self.inner.keys()

        def get_tensor(self, name: str) -> torch.Tensor:
            tensor = self.inner.get_tensor(name)
            log.add(name, tensor, whole=True)
            return tensor

        def get_slice(self, name: str) -> Slice:
            return Slice(name, self.inner.get_slice(name))

    return Handle


def checkpoint_tensors(folder: Path) -> dict[str, int]:
    """Bytes of every tensor, from the safetensors header (not through the loader)."""
    raw = (folder / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    return {name: end - start for name, (start, end) in
            ((n, h["data_offsets"]) for n, h in header.items())}  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(
        tmp_path_factory.mktemp("tp-load"), num_attention_heads=8, num_key_value_heads=KV_HEADS,
        hidden_size=128, attention_bias=True, mlp_bias=True,
    )  # fmt: skip


def load_rank(folder: Path, rank: int, size: int, monkeypatch: pytest.MonkeyPatch) -> ReadLog:
    import safetensors

    log = ReadLog()
    monkeypatch.setattr(safetensors, "safe_open", counting_safe_open(log, safetensors.safe_open))
    load_model(folder, "cpu", torch.float32, "torch", single(rank, size))
    monkeypatch.undo()
    return log


@pytest.mark.parametrize("size", [2, 4])
def test_ranks_read_each_slice_once_and_the_checkpoint_once_between_them(folder, size, monkeypatch):
    tensors = checkpoint_tensors(folder)
    total = sum(tensors.values())
    replicated = sum(b for n, b in tensors.items() if n.endswith("norm.weight"))
    # rank 0 holds the o/down biases (added once, after the all-reduce); the others zeros
    row_biases = sum(b for n, b in tensors.items() if n.endswith(("o_proj.bias", "down_proj.bias")))
    # 2 KV heads: with 4 ranks each KV head is replicated on 2 ranks (read by both)
    kv = sum(b for n, b in tensors.items() if ".k_proj." in n or ".v_proj." in n)
    kv_copies = max(1, size // KV_HEADS)
    logs = [load_rank(folder, rank, size, monkeypatch) for rank in range(size)]
    for log in logs:
        assert set(log.names.values()) == {1}, "a tensor was read twice"
        assert log.whole <= {n for n in tensors if n.endswith("norm.weight")} | (
            {n for n in tensors if n.endswith(("o_proj.bias", "down_proj.bias"))}
        )
    assert sum(log.bytes for log in logs) == (
        total + (size - 1) * replicated + (kv_copies - 1) * kv
    )
    assert logs[0].bytes - logs[1].bytes == row_biases
    split = total - replicated - row_biases - kv
    for log in logs[1:]:
        assert log.bytes == split // size + replicated + kv * kv_copies // size


def test_one_rank_reads_the_checkpoint_whole(folder, monkeypatch):
    log = load_rank(folder, 0, 1, monkeypatch)
    assert log.bytes == sum(checkpoint_tensors(folder).values())
    assert log.whole == set(checkpoint_tensors(folder))
