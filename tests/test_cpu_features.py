"""`--dtype auto` on the CPU: bf16 where the CPU has native bf16, fp32 elsewhere, and why."""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.engine.cpu_features import (
    CpuFeatures,
    choose_dtype,
    choose_kv_dtype,
    cpuinfo_flags,
    detect_cpu_features,
)

ZEN4 = "processor : 0\nflags : fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n\nprocessor : 1\nflags : fpu\n"
SKYLAKE = "processor : 0\nflags : fpu sse2 avx2 avx512f avx512_vnni\n"
SAPPHIRE = "flags : avx512f amx_tile amx_bf16 amx_int8\n"


def test_cpuinfo_flags_are_the_union_of_every_flags_line() -> None:
    assert {"avx512_bf16", "avx512_vnni", "fpu"} <= cpuinfo_flags(ZEN4)
    assert "Features" not in cpuinfo_flags("Features : fp asimd bf16\n")
    assert "bf16" in cpuinfo_flags("Features : fp asimd bf16\n")


@pytest.mark.parametrize(
    "cpuinfo,dtype,flag",
    [(ZEN4, torch.bfloat16, "avx512_bf16"), (SAPPHIRE, torch.bfloat16, "amx_bf16"),
     (SKYLAKE, torch.float32, None)],
)  # fmt: skip
def test_auto_follows_the_cpus_bf16_units(cpuinfo: str, dtype: torch.dtype, flag: str | None) -> None:
    features = detect_cpu_features(cpuinfo)
    choice = choose_dtype("auto", "cpu", features=features)
    assert choice.dtype == dtype
    assert (flag in choice.reason) if flag else ("no native bf16" in choice.reason)


def test_explicit_dtypes_and_the_gpu() -> None:
    bf16 = CpuFeatures(avx512_bf16=True, amx_bf16=False, avx512_vnni=True, source="test")
    assert choose_dtype("float32", "cpu", features=bf16).dtype == torch.float32
    assert choose_dtype("auto", "cpu", features=bf16).dtype == torch.bfloat16
    assert choose_dtype("auto", "cuda").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        choose_dtype("int4", "cpu")


def test_this_machines_answer_agrees_with_its_cpuinfo() -> None:
    """torch's capability query and /proc/cpuinfo say the same about this CPU."""
    from pathlib import Path

    info = Path("/proc/cpuinfo")
    if not info.is_file():
        pytest.skip("no /proc/cpuinfo")
    from_torch = detect_cpu_features()
    from_file = detect_cpu_features(info.read_text())
    assert from_torch.avx512_bf16 == from_file.avx512_bf16


def test_kv_cache_dtype_auto_is_the_model_dtype() -> None:
    assert choose_kv_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert choose_kv_dtype("float32", torch.bfloat16) == torch.float32
    with pytest.raises(ValueError):
        choose_kv_dtype("int8", torch.float32)
