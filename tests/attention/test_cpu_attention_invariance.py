"""The compiled CPU attention gives a query the same bits however its forward is cut: inside a
whole prefill, after a cached prefix (1 or several new tokens, the decode path included), and
beside other requests. With the options each family sets: a GQA group of 3 (SmolLM2), a
sliding window, sink logits (gpt-oss) and soft-capping (Gemma 2); fp32 and bf16.

The oracle for "the same" is the query computed in one whole prefill; the kernel's closeness
to plain softmax attention is `test_cpu_attention.py`'s business.
"""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.attention.cpu_backend import KV_CHUNK, QUERY_BLOCK
from sluice.runtime.kernels import cpu_extension

pytestmark = pytest.mark.skipif(not cpu_extension.available(), reason="CPU kernels not built")

LENGTH = 2 * KV_CHUNK + 77  # three split-KV chunks
HEAD_DIM = 64
OPTIONS = {
    "plain": dict(window=0, sinks=False, softcap=0.0),
    "window": dict(window=100, sinks=False, softcap=0.0),
    "sinks+window": dict(window=300, sinks=True, softcap=0.0),
    "softcap": dict(window=0, sinks=False, softcap=2.0),
}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: list[int],
            extend: list[int], opts: dict, sinks: torch.Tensor) -> torch.Tensor:  # fmt: skip
    rows = len(prefix)
    table = torch.arange(LENGTH, dtype=torch.int32).repeat(rows, 1)
    return torch.ops.sluice_cpu.paged_attention(
        q, k, v, table, torch.arange(rows), torch.tensor(prefix), torch.tensor(extend),
        HEAD_DIM**-0.5, KV_CHUNK, QUERY_BLOCK, opts["window"],
        sinks if opts["sinks"] else None, opts["softcap"],
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("group", [3, 1])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_a_query_gets_the_same_bits_however_its_forward_is_cut(dtype: torch.dtype, group: int,
                                                               name: str) -> None:  # fmt: skip
    opts = OPTIONS[name]
    kv_heads = 2
    heads = kv_heads * group
    g = torch.Generator().manual_seed(group)
    q = torch.randn(LENGTH, heads, HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(LENGTH, kv_heads, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(LENGTH, kv_heads, HEAD_DIM, generator=g).to(dtype)
    sinks = torch.randn(heads, generator=g)
    whole = _attend(q, k, v, [0], [LENGTH], opts, sinks)
    for start, count in [(LENGTH - 1, 1), (KV_CHUNK - 1, 1), (KV_CHUNK, 1), (300, 5),
                         (17, 40), (KV_CHUNK - 3, 60), (0, 33)]:  # fmt: skip
        part = _attend(q[start : start + count], k, v, [start], [count], opts, sinks)
        assert torch.equal(part, whole[start : start + count]), (start, count)
    # beside two other requests (their queries first), each at its own prefix
    starts, counts = [5, 400, 250], [20, 3, 1]
    batch_q = torch.cat([q[s : s + c] for s, c in zip(starts, counts, strict=True)])
    batch = _attend(batch_q, k, v, starts, counts, opts, sinks)
    assert torch.equal(batch, torch.cat([whole[s : s + c] for s, c in zip(starts, counts, strict=True)]))
