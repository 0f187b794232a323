"""Check the compiled CPU attention kernel on this CPU before it serves a token.

The kernel is compiled here with `-march=native`, so the code that runs differs from CPU
to CPU (vector width, native bf16 conversions, what the vectoriser does with the fast-math
flags); a test suite that passed on one CPU proves nothing about the instructions another
CPU gets. Before the `cpu` backend uses the kernel, `kernel_problem()` runs it once on
small problems that take each of its code paths, with the shapes of the models served
(GQA groups of 1, 3 and 8; head_dim 64, 128 and a runtime-sized one; bf16 and fp32 queries and
caches) and the cases a prefix cache produces (one, a few and many new tokens after a
cached prefix, a prefill from nothing, a decode long enough to be split over threads), and
compares it with attention computed in float64 from the same inputs. A kernel that
disagrees is not used: the backend runs its torch fallback and says why, so a
miscompiled kernel costs speed, never answers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

# q/out rounded to bf16 carry a relative error of 2^-8; values here are O(1)
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 2.5e-2}


@dataclass(frozen=True)
class Case:
    prefix: tuple[int, ...]  # per request, tokens already in the cache
    extend: tuple[int, ...]  # per request, new tokens computed by this call
    heads: int
    kv_heads: int
    head_dim: int
    kv_chunk: int


CASES = [
    # decode rows over cached prefixes (a GQA group of 3 as SmolLM2: the few-rows path)
    Case((36, 5), (1, 1), 9, 3, 64, 256),
    # a decode split over key chunks, merged afterwards
    Case((300,), (1,), 8, 1, 128, 256),
    # 1, 2 and 5 new tokens after a cached prefix, extend-style (one key chunk)
    Case((32, 32, 32), (1, 2, 5), 9, 3, 64, 1 << 30),
    # a prefill from nothing, several query blocks, and a chunk over a cached prefix
    Case((0, 16), (37, 24), 4, 4, 64, 1 << 30),
    # head_dim not fixed at compile time
    Case((20,), (3,), 4, 2, 96, 1 << 30),
]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: Case,
               slots: list[list[int]], scale: float) -> torch.Tensor:  # fmt: skip
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = case.heads // case.kv_heads
    start = 0
    for prefix, extend, rows in zip(case.prefix, case.extend, slots, strict=True):
        keys = k[rows].double().repeat_interleave(group, dim=1)  # [seq, heads, dim]
        values = v[rows].double().repeat_interleave(group, dim=1)
        for j in range(extend):
            visible = prefix + j + 1
            qj = q[start + j].double()  # [heads, dim]
            scores = torch.einsum("hd,thd->ht", qj, keys[:visible]) * scale
            out[start + j] = torch.einsum("ht,thd->hd", scores.softmax(-1), values[:visible])
        start += extend
    return out


Kernel = Callable[..., torch.Tensor]  # torch.ops.sluice_cpu.paged_attention's signature


def _run_case(kernel: Kernel, case: Case, dtype: torch.dtype, generator: torch.Generator) -> float:
    """Max abs error of the kernel against float64 on one case."""
    seqs = [p + e for p, e in zip(case.prefix, case.extend, strict=True)]
    total_slots = sum(seqs) + 1  # slot 0 is the pool's reserved slot
    order = torch.randperm(total_slots - 1, generator=generator) + 1  # scattered slots
    slots, used = [], 0
    for n in seqs:
        slots.append(order[used : used + n].tolist())
        used += n
    table = torch.zeros(len(seqs), max(seqs) + 8, dtype=torch.int32)
    for row, s in enumerate(slots):
        table[row, : len(s)] = torch.tensor(s, dtype=torch.int32)
    shape = (total_slots, case.kv_heads, case.head_dim)
    k = torch.randn(shape, generator=generator).to(dtype)
    v = torch.randn(shape, generator=generator).to(dtype)
    q = torch.randn(sum(case.extend), case.heads, case.head_dim, generator=generator).to(dtype)
    scale = case.head_dim**-0.5
    lengths = {"dtype": torch.int64}
    got = kernel(
        q, k, v, table, torch.arange(len(seqs), dtype=torch.int64),
        torch.tensor(case.prefix, **lengths), torch.tensor(case.extend, **lengths), scale,
        case.kv_chunk, 16,
    )  # fmt: skip
    expected = _reference(q, k, v, case, slots, scale)
    return (got.double() - expected).abs().max().item()


@functools.cache
def kernel_problem() -> str | None:
    """None when the loaded kernel agrees with float64 attention on every case, else what
    disagreed (the kernels must be loaded: `cpu_extension.load()`). Once per process."""
    return check_kernel(torch.ops.sluice_cpu.paged_attention)


def check_kernel(kernel: Kernel) -> str | None:
    generator = torch.Generator().manual_seed(0)
    for dtype, bound in TOLERANCE.items():
        for case in CASES:
            error = _run_case(kernel, case, dtype, generator)
            if not error <= bound:  # also catches NaN
                return (f"the compiled paged attention kernel is wrong on this CPU: {dtype} "
                        f"{case}: max abs error {error:.3g} > {bound:g} against float64")  # fmt: skip
    return None
