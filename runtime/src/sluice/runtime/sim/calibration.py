"""The calibration file `sluice calibrate` writes and `sluice simulate` / `sluice plan` read:
the fitted step-time model, what it was measured on, and what the simulator needs to size
a replica exactly like `ModelWorker` would (KV bytes per token, the model's context)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluice.runtime.sim.cost_model import ServingCost, StepCostModel

FORMAT_VERSION = 1

# `sluice serve` flags that change what a step costs: a calibration holds for one choice of
# each; `sluice simulate` refuses flags that differ (recalibrate instead)
COST_FLAGS = (
    "device", "dtype", "kv_cache_dtype", "quantization", "attention_backend",
    "torch_threads", "enable_deterministic_inference", "disable_cuda_graph", "cuda_graph_max_bs",
)  # fmt: skip


# the instruction-set extensions a CPU step time depends on (GEMM and attention kernels)
PERF_CPU_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
CPU_IDENTITY = ("cpu", "cpu_flags", "cores")


def cpu_identity() -> dict[str, Any]:
    """What a CPU calibration holds for: the CPU's model name, the speed-relevant flags it
    has, and its cores."""
    from sluice.runtime.engine.cpu_features import CPUINFO, cpuinfo_flags

    try:
        text = CPUINFO.read_text()
    except OSError:
        text = ""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in text.splitlines()
            if line.startswith("model name")
        ),
        "",
    )
    flags = cpuinfo_flags(text)
    return {"cpu": cpu or platform.processor(), "cpu_flags": [f for f in PERF_CPU_FLAGS if f in flags],
            "cores": os.cpu_count()}  # fmt: skip


def model_fingerprint(model_path: str | Path) -> str:
    """The SHA-256 of a model folder's config.json ("" without one): which model a
    calibration measured, whatever folder it is read from."""
    config = Path(model_path) / "config.json"
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else ""


@dataclass(frozen=True)
class ModelFacts:
    path: str
    vocab_size: int
    eos_token_ids: list[int]
    bytes_per_token: int  # KV bytes per token over all layers
    model_context_len: int  # the model's own limit
    device: str
    dtype: str
    attention_backend: str
    torch_threads: int
    # a model with full and sliding-window layers: the window and the sliding layers'
    # share of `bytes_per_token` (0: no window pool)
    window: int = 0
    window_bytes_per_token: int = 0
    # a mixture-of-experts model: experts per MoE layer and how many each token picks
    num_experts: int = 0
    experts_per_token: int = 0
    config_sha256: str = ""  # model_fingerprint of the calibrated model


def window_facts(worker: Any) -> dict[str, int]:
    """`ModelFacts`' window fields of a `ModelWorker`'s model."""
    sliding = worker.sliding
    if sliding is None:
        return {}
    return {"window": sliding.window, "window_bytes_per_token": sliding.window_bytes}


@dataclass(frozen=True)
class Startup:
    """Seconds from a pod's start to ready: the process and its imports, the model load
    (ModelWorker), the warm-up generation."""

    process_start_s: float
    model_load_s: float
    warmup_s: float

    @property
    def total_s(self) -> float:
        return self.process_start_s + self.model_load_s + self.warmup_s


@dataclass(frozen=True)
class Calibration:
    model: ModelFacts
    cost_flags: dict[str, Any]  # the COST_FLAGS values it was measured with
    kv_pool_tokens: int  # the pool the calibration's worker had (GPU: from its memory)
    costs: StepCostModel
    startup: Startup
    fit_errors: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    calibration_seconds: float = 0.0
    kv_window_tokens: int = 0  # its sliding layers' own pool (0: none)
    serving: ServingCost = field(default_factory=ServingCost)  # measured through a server

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "model": asdict(self.model),
            "cost_flags": self.cost_flags,
            "kv_pool_tokens": self.kv_pool_tokens,
            "kv_window_tokens": self.kv_window_tokens,
            "costs": self.costs.to_dict(),
            "serving": self.serving.to_dict(),
            "startup": {**asdict(self.startup), "total_s": self.startup.total_s},
            "fit_errors": self.fit_errors,
            "machine": self.machine,
            "calibration_seconds": self.calibration_seconds,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"calibration format {d.get('format_version')!r} is not {FORMAT_VERSION}; "
                "rerun `sluice calibrate`"
            )
        startup = {k: v for k, v in d["startup"].items() if k != "total_s"}
        return cls(
            model=ModelFacts(**d["model"]),
            cost_flags=dict(d["cost_flags"]),
            kv_pool_tokens=int(d["kv_pool_tokens"]),
            costs=StepCostModel.from_dict(d["costs"]),
            startup=Startup(**startup),
            fit_errors=d.get("fit_errors", {}),
            machine=d.get("machine", {}),
            calibration_seconds=float(d.get("calibration_seconds", 0.0)),
            kv_window_tokens=int(d.get("kv_window_tokens", 0)),
            serving=ServingCost.from_dict(d.get("serving", {})),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Calibration:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(
                f"no calibration file at {path}; run `sluice calibrate` first"
            ) from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a calibration file: {err}") from None
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a calibration file (missing {err})") from None

    def other_cpu(self, here: dict[str, Any] | None = None) -> str | None:
        """One line when this CPU calibration was measured on another CPU than `here` (this
        machine by default): its model name, speed-relevant flags or cores differ. None for
        the same CPU, and for a GPU calibration."""
        if self.model.device != "cpu":
            return None
        here = cpu_identity() if here is None else here
        differ = [k for k in CPU_IDENTITY if k in self.machine and self.machine[k] != here.get(k)]
        if not differ:
            return None

        def describe(m: dict[str, Any]) -> str:
            return f"{m.get('cpu')!r} ({', '.join(m.get('cpu_flags') or []) or 'no AVX-512/AMX flags'}; {m.get('cores')} cores)"

        return (f"the calibration was measured on another CPU, {describe(self.machine)}; this machine "
                f"is {describe(here)}: run `sluice calibrate` here (or pass --allow-other-cpu to simulate "
                "the calibrated machine)")  # fmt: skip

    def other_model(self, model_path: str | Path) -> str | None:
        """One line when `model_path` holds another model than the one calibrated."""
        mine, theirs = self.model.config_sha256, model_fingerprint(model_path)
        if not mine or not theirs or mine == theirs:
            return None
        return (f"the calibration measured {self.model.path}; {model_path} is another model (its "
                "config.json differs): run `sluice calibrate --model` with it")  # fmt: skip

    def mismatched_flags(self, values: dict[str, Any]) -> list[str]:
        """`--flag VALUE` descriptions of the cost flags in `values` that differ from the
        calibration's (a value equal to what the calibration's flag resolved to, e.g.
        `--dtype bfloat16` for a calibration run with `--dtype auto` on a bf16 CPU, agrees)."""
        resolved = {
            "device": self.model.device,
            "dtype": self.model.dtype,
            "attention_backend": self.model.attention_backend,
            "torch_threads": self.model.torch_threads,
        }
        out = []
        for name in COST_FLAGS:
            if name not in values or name not in self.cost_flags:
                continue
            value = values[name]
            if value in (self.cost_flags[name], resolved.get(name, object())):
                continue
            flag = "--" + name.replace("_", "-")
            out.append(f"{flag} {value!r} (calibrated with {self.cost_flags[name]!r})")
        return out
