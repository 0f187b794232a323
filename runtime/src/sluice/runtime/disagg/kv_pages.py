"""A request's KV pages read out of the pool and written into another pool, as bytes.

The unit is the page: a transfer moves the pages holding a prompt's positions [0, n),
in chunks of whole pages. Both pools must lay K/V out the same way (`KVLayout`: the same
layers, heads, head size, element type and page size); the decode side says its layout in
its reservation and the prefill side refuses a different one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from sluice.runtime.memory.kv_buffers import KVBuffers


@dataclass(frozen=True)
class KVLayout:
    layers: tuple[int, ...]  # the layers that have K/V buffers
    kv_heads: int
    head_dim: int
    dtype: str
    page_size: int

    @classmethod
    def of(cls, kv: KVBuffers, page_size: int) -> KVLayout:
        dtype = str(kv.dtype).removeprefix("torch.")
        return cls(tuple(sorted(kv.layers)), kv.num_kv_heads, kv.head_dim, dtype, page_size)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "layers": list(self.layers)}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> KVLayout:
        return cls(tuple(d["layers"]), d["kv_heads"], d["head_dim"], d["dtype"], d["page_size"])  # type: ignore[arg-type]

    def difference(self, other: KVLayout) -> str:
        """What differs, in words ("" when nothing does)."""
        mine, theirs = asdict(self), asdict(other)
        return ", ".join(
            f"{k} {mine[k]} here, {theirs[k]} there" for k in mine if mine[k] != theirs[k]
        )


class KVPages:
    """Reads and writes token positions of a request's pages in one pool's K/V buffers."""

    def __init__(self, kv: KVBuffers, page_size: int) -> None:
        self.kv = kv
        self.page_size = page_size
        self.layout = KVLayout.of(kv, page_size)
        self._layers = self.layout.layers

    def slots(self, pages: list[int], start: int, end: int) -> torch.Tensor:
        """The pool slots of positions [start, end) of a sequence laid out on `pages`."""
        pos = torch.arange(start, end)
        ps = self.page_size
        return torch.tensor(pages, dtype=torch.long)[pos // ps] * ps + pos % ps

    def read(self, pages: list[int], start: int, end: int) -> tuple[bytes, bytes]:
        """K and V of positions [start, end), every layer, as two byte strings."""
        idx = self.slots(pages, start, end)
        k = torch.stack([self.kv.k[layer].index_select(0, idx) for layer in self._layers])
        v = torch.stack([self.kv.v[layer].index_select(0, idx) for layer in self._layers])
        return _bytes(k), _bytes(v)

    def write(self, pages: list[int], start: int, end: int, k: bytes, v: bytes) -> None:
        """Store what `read` gave for positions [start, end) at this pool's `pages`."""
        idx = self.slots(pages, start, end)
        shape = (len(self._layers), end - start, self.kv.num_kv_heads, self.kv.head_dim)
        k_all, v_all = _tensor(k, self.kv.dtype, shape), _tensor(v, self.kv.dtype, shape)
        for i, layer in enumerate(self._layers):
            self.kv.k[layer].index_copy_(0, idx, k_all[i])
            self.kv.v[layer].index_copy_(0, idx, v_all[i])


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _tensor(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    expected = (
        torch.Size(shape).numel() * torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 0
    )
    if len(data) != expected:
        raise ValueError(f"KV chunk of {len(data)} bytes, expected {expected} for {shape}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).view(shape)
