"""What the CPU can do fast, and the dtype `--dtype auto` picks from it.

bf16 matmuls are several times faster than fp32 on CPUs with native bf16 dot products
(AVX-512 BF16, AMX), and several times slower on CPUs without them (bf16 is then emulated
through fp32). So `auto` asks torch's own capability query first (it reports what the
oneDNN kernels it ships will use) and falls back to the flags in `/proc/cpuinfo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's relevant instruction-set extensions and where that knowledge came from."""

    avx512_bf16: bool
    amx_bf16: bool
    avx512_vnni: bool
    source: str  # "torch" or "/proc/cpuinfo"

    @property
    def native_bf16(self) -> bool:
        return self.avx512_bf16 or self.amx_bf16

    @property
    def bf16_flags(self) -> list[str]:
        return [name for name in BF16_CPU_FLAGS if getattr(self, name)]


def cpuinfo_flags(text: str) -> set[str]:
    """The union of every `flags` line of a `/proc/cpuinfo` text (x86) or `Features` (arm)."""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def detect_cpu_features(cpuinfo: str | None = None) -> CpuFeatures:
    """Ask torch (`torch.cpu._is_avx512_bf16_supported`, `_is_amx_tile_supported`); where
    this torch build lacks the query, or `cpuinfo` text is given, read the flags instead."""
    if cpuinfo is None:
        probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        if probe is not None and amx is not None:
            flags = _read_cpuinfo()
            return CpuFeatures(
                avx512_bf16=bool(probe()),
                amx_bf16=bool(amx()),
                avx512_vnni="avx512_vnni" in flags,
                source="torch",
            )
        cpuinfo = CPUINFO.read_text() if CPUINFO.is_file() else ""
    flags = cpuinfo_flags(cpuinfo)
    return CpuFeatures(
        avx512_bf16="avx512_bf16" in flags,
        amx_bf16="amx_bf16" in flags,
        avx512_vnni="avx512_vnni" in flags,
        source=str(CPUINFO),
    )


def _read_cpuinfo() -> set[str]:
    try:
        return cpuinfo_flags(CPUINFO.read_text())
    except OSError:
        return set()


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def choose_dtype(name: str, device: str, *, features: CpuFeatures | None = None) -> DtypeChoice:
    """The model dtype for `--dtype name` on `device`, and why."""
    if name != "auto":
        if name not in _DTYPES:
            raise ValueError(f"unknown dtype {name!r}; choose auto or one of {', '.join(_DTYPES)}")
        return DtypeChoice(_DTYPES[name], f"--dtype {name}")
    if device.startswith("cuda"):
        return DtypeChoice(torch.bfloat16, "auto on a GPU")
    features = features or detect_cpu_features()
    if features.native_bf16:
        flags = ", ".join(features.bf16_flags)
        return DtypeChoice(torch.bfloat16, f"auto: the CPU has native bf16 ({flags}, {features.source})")
    return DtypeChoice(
        torch.float32,
        f"auto: the CPU has no native bf16 (no {' or '.join(BF16_CPU_FLAGS)}, {features.source}); "
        "emulated bf16 would be slower than fp32",
    )


def choose_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """`--kv-cache-dtype`: `auto` stores K/V in the model's dtype."""
    if name == "auto":
        return model_dtype
    if name not in ("bfloat16", "float32", "float16"):
        raise ValueError(f"unknown KV cache dtype {name!r}")
    return _DTYPES[name]
