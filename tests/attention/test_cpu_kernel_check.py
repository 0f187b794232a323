"""The start-up check of the compiled CPU attention kernel: it passes the kernel built here,
catches a kernel that reads the wrong keys after a cached prefix, and a failed check makes
the backend run its torch fallback instead of serving wrong answers."""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.attention import cpu_backend
from sluice.runtime.attention.cpu_kernel_check import CASES, check_kernel, kernel_problem
from sluice.runtime.kernels import cpu_extension

needs_kernels = pytest.mark.skipif(not cpu_extension.available(),
                                   reason=f"CPU kernels not built: {cpu_extension.load()}")  # fmt: skip


@needs_kernels
def test_the_kernel_built_here_passes() -> None:
    assert kernel_problem() is None


@needs_kernels
@pytest.mark.parametrize("fault", ["prefix_off_by_one", "bf16_only_stale_prefix", "no_scale"])
def test_a_wrong_kernel_is_caught(fault: str) -> None:
    real = torch.ops.sluice_cpu.paged_attention

    def wrong(q, k, v, table, rows, prefix, extend, scale, kv_chunk, block):
        if fault == "prefix_off_by_one":  # the cached prefix's last key is dropped
            prefix = torch.clamp(prefix - 1, min=0)
            table = torch.cat([table[:, 1:], table[:, :1]], dim=1)
        elif fault == "bf16_only_stale_prefix" and q.dtype == torch.bfloat16:
            table = table.clone()
            table[:, 0] = table[:, 1]  # one cached slot read twice, only in bf16
        elif fault == "no_scale":
            scale = 1.0
        return real(q, k, v, table, rows, prefix, extend, scale, kv_chunk, block)

    problem = check_kernel(wrong)
    assert problem is not None and "wrong on this CPU" in problem


def test_cases_cover_one_few_and_many_new_tokens_after_a_cached_prefix() -> None:
    after_prefix = {e for c in CASES for p, e in zip(c.prefix, c.extend, strict=True) if p}
    assert {1, 2, 5} <= after_prefix and max(after_prefix) > 16
    assert any(c.heads // c.kv_heads == 3 for c in CASES)  # SmolLM2's group: the few-rows path
    assert any(max(c.prefix) > c.kv_chunk for c in CASES)  # a decode split over key chunks


def test_a_failed_check_falls_back_to_torch_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_backend.extension, "load", lambda: None)
    monkeypatch.setattr(cpu_backend, "kernel_problem", lambda: "the kernel is wrong on this CPU")
    backend = cpu_backend.CpuAttentionBackend()
    assert backend.implementation == "torch-varlen"
    with pytest.raises(RuntimeError, match="wrong on this CPU"):
        cpu_backend.CpuAttentionBackend(use_kernels=True)
