"""Per-layer attention options (`LayerAttention`: sliding window, sink logits, soft-cap,
scale) in every CPU-side backend, against attention written out in fp64.

The oracle follows Hugging Face's eager attention of Gemma 2/3 and gpt-oss: scores scaled,
soft-capped, masked to the causal window (a query at p sees keys p - window + 1 .. p), a
sink column appended to each softmax and dropped after it. Batches are ragged, with cached
prefixes longer than the window, decodes far past it and sequences that cross the CPU
kernel's split-KV chunk (256 keys), so a sink must be counted once across chunks.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from test_cpu_attention import HEAD_DIM, Pool, new_qkv, prefill, run

from sluice.runtime.attention.base import LayerAttention
from sluice.runtime.attention.batch_invariant import BatchInvariantAttentionBackend
from sluice.runtime.attention.cpu_backend import CpuAttentionBackend, VarlenTorchAttention
from sluice.runtime.attention.split import SplitBatchAttention
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.kernels import cpu_extension as extension

HEADS, KV_HEADS = 6, 2


def backends() -> list[tuple[str, object]]:
    found = [
        ("torch", TorchAttentionBackend),
        ("varlen", VarlenTorchAttention),
        ("batch-invariant", BatchInvariantAttentionBackend),
        ("split", lambda: SplitBatchAttention(TorchAttentionBackend(), VarlenTorchAttention())),
    ]
    if extension.available():
        found.insert(0, ("kernels", lambda: CpuAttentionBackend(use_kernels=True)))
    if importlib.util.find_spec("triton") is not None:  # under TRITON_INTERPRET=1 (conftest)
        found.append(("triton", _triton))
    return found


def _triton() -> object:
    from sluice.runtime.attention.triton.backend import TritonAttentionBackend
    from sluice.runtime.attention.triton.config import TritonAttentionConfig

    return TritonAttentionBackend(None, TritonAttentionConfig.for_device("cpu"))


def sinks() -> torch.Tensor:
    return torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.25])


OPTIONS = {
    "window": LayerAttention(window=12),
    "window-sinks": LayerAttention(window=9, sinks=sinks()),
    "softcap-scale": LayerAttention(softcap=2.5, scale=0.3),
    "everything": LayerAttention(window=16, sinks=sinks(), softcap=3.0, scale=0.2),
    "sinks-full": LayerAttention(sinks=sinks()),
}


def reference(batch: ForwardBatch, q: torch.Tensor, options: LayerAttention) -> torch.Tensor:
    k_all, v_all = batch.kv.k[0].double(), batch.kv.v[0].double()
    group = HEADS // KV_HEADS
    scale = options.scale if options.scale is not None else HEAD_DIM**-0.5
    out, start = [], 0
    for row, prefix, n in zip(batch.req_pool_indices.tolist(), batch.prefix_lens_cpu,
                              batch.extend_lens_cpu, strict=True):  # fmt: skip
        slots = batch.req_to_token[row, : prefix + n].long()
        keys = k_all[slots].repeat_interleave(group, dim=1)
        values = v_all[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start : start + n].double(), keys) * scale
        if options.softcap is not None:
            scores = torch.tanh(scores / options.softcap) * options.softcap
        query_pos = prefix + torch.arange(n)
        key_pos = torch.arange(prefix + n)
        allowed = key_pos[None, :] <= query_pos[:, None]
        if options.window is not None:
            allowed &= key_pos[None, :] > query_pos[:, None] - options.window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if options.sinks is not None:
            column = options.sinks.double().view(HEADS, 1, 1).expand(HEADS, n, 1)
            probs = torch.cat([scores, column], -1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", probs, values))
        start += n
    return torch.cat(out)


def forward(backend: object, batch: ForwardBatch, q, k, v, options: LayerAttention):
    backend.init_forward_metadata(batch)
    return backend.forward(q, k, v, 0, batch, options)


@pytest.mark.parametrize("option_name", list(OPTIONS))
@pytest.mark.parametrize("name,factory", backends())
def test_decode_past_the_window_matches_math(name, factory, option_name) -> None:
    options = OPTIONS[option_name]
    pool = Pool(HEADS, KV_HEADS, 16, seed=2)
    lens = [1, 7, 40, 300, 600, 17]  # 300 and 600 cross the kernel's 256-key chunks
    rows = list(range(1, len(lens) + 1))
    prefill(pool, rows, [n - 1 for n in lens])
    batch = pool.batch(ForwardMode.DECODE, rows, [1] * len(rows))
    q, k, v = new_qkv(len(rows), HEADS, KV_HEADS)
    out = forward(factory(), batch, q, k, v, options)
    torch.testing.assert_close(out.double(), reference(batch, q, options), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("option_name", list(OPTIONS))
@pytest.mark.parametrize("name,factory", backends())
def test_extend_over_prefixes_longer_than_the_window_matches_math(name, factory, option_name):
    options = OPTIONS[option_name]
    pool = Pool(HEADS, KV_HEADS, 1, seed=4)
    # a decode row first (the split backend's mixed batch), prefixes shorter and longer than
    # every window, an extend longer than the window and than a 16-query block
    rows, prefixes, extends = [1, 2, 3, 4, 5], [30, 0, 5, 40, 280], [1, 50, 7, 33, 20]
    prefill(pool, rows, prefixes)
    batch = pool.batch(ForwardMode.EXTEND, rows, extends)
    q, k, v = new_qkv(sum(extends), HEADS, KV_HEADS)
    out = forward(factory(), batch, q, k, v, options)
    torch.testing.assert_close(out.double(), reference(batch, q, options), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,factory", [b for b in backends() if b[0] != "triton"])
def test_bf16_window_and_sinks_stay_close_to_math(name, factory) -> None:
    options = OPTIONS["everything"]
    pool = Pool(HEADS, KV_HEADS, 16, kv_dtype=torch.bfloat16, seed=6)
    rows = [1, 2]
    prefill(pool, rows, [70, 10])
    batch = pool.batch(ForwardMode.EXTEND, rows, [25, 1])
    q, k, v = new_qkv(26, HEADS, KV_HEADS, dtype=torch.bfloat16)
    out = forward(factory(), batch, q, k, v, options)
    torch.testing.assert_close(out.double(), reference(batch, q, options), atol=3e-2, rtol=3e-2)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_triton_head_dim_256_with_every_option_equals_torch(mode) -> None:
    """Gemma 3's head_dim (256), with its own tile sizes, against the torch backend."""
    from paged_batch import make_case

    options = LayerAttention(window=13, sinks=torch.linspace(-1, 1, 4), softcap=2.0, scale=0.1)
    extend = [1, 1, 1] if mode is ForwardMode.DECODE else [20, 3, 35]
    case = make_case(mode, [40, 9, 0], extend, num_heads=4, num_kv_heads=2, head_dim=256, seed=3)
    outs = []
    for backend in (_triton(), TorchAttentionBackend()):
        case.batch.kv.k[0].copy_(case.cache_k)
        case.batch.kv.v[0].copy_(case.cache_v)
        outs.append(forward(backend, case.batch, case.q, case.k, case.v, options))
    torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=2e-5)


def test_plain_options_leave_the_default_path_unchanged() -> None:
    """A layer with no options gets what the backend gave before options existed."""
    pool = Pool(HEADS, KV_HEADS, 16, seed=8)
    prefill(pool, [1], [40])
    batch = pool.batch(ForwardMode.EXTEND, [1], [9])
    q, k, v = new_qkv(9, HEADS, KV_HEADS)
    plain = run(TorchAttentionBackend(), batch, q, k, v)
    torch.testing.assert_close(plain.double(), reference(batch, q, LayerAttention()),
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def test_options_reject_meaningless_values() -> None:
    with pytest.raises(ValueError, match="window"):
        LayerAttention(window=0)
    with pytest.raises(ValueError, match="soft-cap"):
        LayerAttention(softcap=-1.0)
