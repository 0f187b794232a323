"""`sluice calibrate`: measure the real engine on this machine and fit the step-time model
`sluice simulate` and `sluice plan` run on.

    sluice calibrate [--model M] [sluice serve flags] --output-file calibration.json

In one process: the start-up (the server process's imports, the model load, the warm-up
generation: a pod's start-up time), then for each loop kind the real `Scheduler` over the
real `ModelWorker` through the calibration scenarios (`profile.scenarios`), every tick
timed. The forward and the host work before and after it are fitted separately (see
`cost_model`), on three quarters of the points; the file reports the error on the quarter
held out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.runtime.dataclass_cli import add_flags, flags_of, option
from sluice.runtime.sim.calibration import (
    COST_FLAGS,
    Calibration,
    ModelFacts,
    Startup,
    cpu_identity,
    model_fingerprint,
    window_facts,
)
from sluice.runtime.sim.cost_model import (
    HOST_PROCESS_TERMS,
    HOST_SCHEDULE_TERMS,
    LOOPS,
    FitError,
    LinearCost,
    LoopCost,
    ServingCost,
    StepCostModel,
    fit_forward,
    fit_linear,
)
from sluice.runtime.sim.profile import TickPoint
from sluice.runtime.sim.server_flags import (
    MODEL_FLAGS,
    add_server_flags,
    cost_flag_values,
    server_args_from,
)

# the pool and the batch shapes; the loop kinds come from --loops
SHAPE_FLAGS = (
    "page_size", "max_total_tokens", "cpu_kv_cache_gib", "mem_fraction_static",
    "max_running_requests", "max_prefill_tokens", "chunked_prefill_size", "max_context_len",
)  # fmt: skip
CALIBRATE_SERVER_FLAGS = MODEL_FLAGS + COST_FLAGS + SHAPE_FLAGS
TRIM_FACTOR = 3.0  # a point further off the first fit than this many median errors is noise
TRIM_FLOOR = 0.3  # ... and never closer than this relative error


@dataclass(frozen=True)
class CalibrateArgs:
    output_file: str = option("calibration.json", "Where the calibration is written (JSON).")
    points_file: str = option("", "Also write every measurement here (JSON lines).")
    loops: str = option("normal,overlap", "Loop kinds to calibrate, comma-separated.")
    repeats: int = option(2, "Runs of each scenario per loop (more resist other load).")
    scale: float = option(1.0, "Scales the scenarios' prompt lengths (smaller: quicker).")
    held_out_fraction: float = option(0.25, "Share of the points kept out of the fit to report its error.")
    seed: int = option(0, "Seed of the prompts and of the held-out split.")
    quick: bool = option(
        False, "Under a minute on 2 cores: the loop the server runs only, one pass, prompts at "
        "half length, and a shorter served phase (a rougher fit).",
    )
    skip_served_phase: bool = option(
        False, "Do not measure through a real server (`sluice serve` with these flags): the "
        "hand-over, the return and the streaming costs then stay 0, and the simulator sees "
        "the scheduler alone.",
    )
    clock: str = option(
        "wall", "wall: elapsed time (what a server sees). cpu: the engine thread's CPU time, "
        "which other processes on a shared machine barely move; needs --loops normal and "
        "--torch-threads 1 (the forward then runs on the measuring thread alone).", ("wall", "cpu"),
    )

    def loop_names(self, server_loop: str = "") -> list[str]:
        """The loops to measure; `--quick`: only `server_loop`, the one the server runs."""
        if self.quick and server_loop:
            return [server_loop]
        names = [n.strip() for n in self.loops.split(",") if n.strip()]
        unknown = [n for n in names if n not in LOOPS]
        if unknown or not names:
            raise ValueError(f"--loops: choose from {', '.join(LOOPS)} (got {self.loops!r})")
        return names

    @property
    def passes(self) -> int:
        return 1 if self.quick else self.repeats

    @property
    def prompt_scale(self) -> float:
        return self.scale * (0.5 if self.quick else 1.0)

    def validate(self, torch_threads: int = 0, server_loop: str = "normal") -> None:
        loops = self.loop_names(server_loop)
        if self.clock == "cpu" and (loops != ["normal"] or torch_threads != 1):
            raise ValueError("--clock cpu needs --loops normal and --torch-threads 1")
        if not self.skip_served_phase and server_loop not in loops:
            raise ValueError(f"the served phase runs the server's {server_loop} loop: add it to --loops "
                             "or pass --skip-served-phase")  # fmt: skip
        if self.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if not 0.0 < self.scale <= 4.0:
            raise ValueError("--scale must be in (0, 4]")
        if not 0.0 < self.held_out_fraction < 0.9:
            raise ValueError("--held-out-fraction must be in (0, 0.9)")


def add_parser_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, CalibrateArgs)
    add_server_flags(parser, CALIBRATE_SERVER_FLAGS)


def measure_process_start() -> float:
    """Seconds a fresh interpreter takes to import what `sluice serve` imports."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import sluice.runtime.launch"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return time.perf_counter() - t0


def _split(points: list[TickPoint], fraction: float, seed: int) -> tuple[list[TickPoint], list[TickPoint]]:
    order = list(range(len(points)))
    random.Random(seed).shuffle(order)
    cut = int(round(len(points) * fraction))
    held = {i for i in order[:cut]}
    return [p for i, p in enumerate(points) if i not in held], [p for i, p in enumerate(points) if i in held]


def _fit(kind: str, points: Sequence[TickPoint], experts: tuple[int, int] | None = None) -> LinearCost:
    feats = [p.features for p in points]
    secs = [p.seconds for p in points]
    if kind == "forward":
        return fit_forward(feats, secs, experts=experts)
    terms = HOST_SCHEDULE_TERMS if kind == "host_schedule" else HOST_PROCESS_TERMS
    return fit_linear(feats, secs, terms)


def fit_trimmed(
    kind: str, points: Sequence[TickPoint], experts: tuple[int, int] | None = None
) -> tuple[LinearCost, int]:
    """Fit, drop the points far off it (another process took the cores), fit again."""
    first = _fit(kind, points, experts)
    rel = [abs(first.predict(p.features) - p.seconds) / max(p.seconds, 1e-9) for p in points]
    med = sorted(rel)[len(rel) // 2]
    limit = max(TRIM_FACTOR * med, TRIM_FLOOR)
    kept = [p for p, r in zip(points, rel, strict=True) if r <= limit]
    if len(kept) < max(8, len(points) // 2):
        return first, 0
    return _fit(kind, kept, experts), len(points) - len(kept)


def fit_loops(
    points: list[TickPoint],
    loops: Sequence[str],
    held_out_fraction: float,
    seed: int,
    experts: tuple[int, int] | None = None,
) -> tuple[StepCostModel, dict[str, Any]]:
    costs: dict[str, LoopCost] = {}
    errors: dict[str, Any] = {}
    for loop in loops:
        fitted: dict[str, LinearCost] = {}
        errors[loop] = {}
        for kind in ("forward", "host_schedule", "host_process"):
            mine = [p for p in points if p.loop == loop and p.kind == kind]
            if not mine:
                raise ValueError(f"no {kind} measurements for the {loop} loop")
            train, held = _split(mine, held_out_fraction, seed)
            cost, dropped = fit_trimmed(kind, train, experts)
            fitted[kind] = cost
            errors[loop][kind] = {
                "train": FitError.of(cost, [p.features for p in train], [p.seconds for p in train]).to_dict(),
                "held_out": FitError.of(cost, [p.features for p in held], [p.seconds for p in held]).to_dict(),
                "trimmed_points": dropped,
            }
        costs[loop] = LoopCost(fitted["forward"], fitted["host_schedule"], fitted["host_process"])
    return StepCostModel(costs), errors


def machine_info() -> dict[str, Any]:
    return {
        **cpu_identity(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def run_calibration(
    cal_args: CalibrateArgs, server_args: Any, log: Any = print, measure_startup: bool = True
) -> Calibration:
    import torch

    from sluice.runtime.cache_dir import default_cache_dir
    from sluice.runtime.engine.model_worker import ModelWorker
    from sluice.runtime.ipc.messages import SamplingParams, TokenizedGenerateReq
    from sluice.runtime.memory.kv_buffers import bytes_per_token
    from sluice.runtime.model.loader import resolve_model_path
    from sluice.runtime.scheduler.process import build_scheduler
    from sluice.runtime.sim.profile import Profiler, scenarios, warmup_scenario

    began = time.perf_counter()
    machine = machine_info()
    cache_dir = Path(server_args.model_cache_dir) if server_args.model_cache_dir else default_cache_dir()
    model_path = resolve_model_path(server_args.model, cache_dir)
    log(f"calibrating {model_path} (load average {machine['load_average']})")
    process_start = measure_process_start() if measure_startup else 0.0
    t0 = time.perf_counter()
    worker = ModelWorker(server_args, model_path)
    model_load = time.perf_counter() - t0
    log(f"start-up: imports {process_start:.1f} s, model load {model_load:.1f} s")
    cfg = worker.model_config
    points: list[TickPoint] = []
    warmup = 0.0
    server_loop = "overlap" if server_args.overlap_schedule else "normal"
    loops = cal_args.loop_names(server_loop)
    for i, loop in enumerate(loops):
        args = dataclasses.replace(
            server_args,
            disable_overlap_schedule=loop == "normal",
            enable_overlap_schedule=loop == "overlap",
        )
        scheduler = build_scheduler(args, worker)
        try:
            if i == 0:  # the first generation after the load: what the server's warm-up pays
                t0 = time.perf_counter()
                params = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
                scheduler.handle(TokenizedGenerateReq("warmup", worker.tokenizer.encode("Hello"), params, time.time()))
                while scheduler.has_work:
                    scheduler.step_overlap() if loop == "overlap" else scheduler.step()
                scheduler.take_output()
                warmup = time.perf_counter() - t0
            profiler = Profiler(scheduler, worker, overlap=(loop == "overlap"), seed=cal_args.seed,
                                clock=cal_args.clock)  # fmt: skip
            profiler.run(warmup_scenario(worker.pool.rows), record=False)
            plan = scenarios(worker.pool.rows, worker.context_len, cal_args.prompt_scale)
            t_loop = time.perf_counter()
            for rep in range(cal_args.passes):
                for sc in plan:
                    profiler.run(sc)
                log(f"  {loop} loop, pass {rep + 1}/{cal_args.passes}: {profiler.ticks} ticks, "
                    f"{time.perf_counter() - t_loop:.0f} s")  # fmt: skip
            points += profiler.points
        finally:
            scheduler.executor.close()
    experts = (cfg.moe.num_experts, cfg.moe.top_k) if cfg.moe is not None else None
    costs, errors = fit_loops(points, loops, cal_args.held_out_fraction, cal_args.seed, experts)
    serving = ServingCost()
    if not cal_args.skip_served_phase:
        from sluice.runtime.sim.served import measure_serving

        flags = flags_of(server_args, tuple(n for n in CALIBRATE_SERVER_FLAGS if n != "model"))
        served = measure_serving(
            server_args.model, flags, worker.tokenizer, costs.loop(server_loop == "overlap"),
            worker.context_len, worker.pool.rows, cal_args.prompt_scale, cal_args.seed, log,
        )  # fmt: skip
        serving = served.serving
        errors["served_phase"] = served.report
    if cal_args.points_file:
        with Path(cal_args.points_file).open("w") as fh:
            for p in points:
                fh.write(json.dumps(p.to_dict()) + "\n")
    facts = ModelFacts(
        path=str(model_path),
        vocab_size=cfg.vocab_size,
        eos_token_ids=list(worker.eos_token_ids),
        bytes_per_token=bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, worker.kv_dtype),
        model_context_len=worker.pool.model_context_len,
        device=worker.device,
        dtype=str(worker.dtype).removeprefix("torch."),
        attention_backend=worker.attention_backend_name,
        torch_threads=torch.get_num_threads(),
        **window_facts(worker),
        config_sha256=model_fingerprint(model_path),
        num_experts=experts[0] if experts else 0,
        experts_per_token=experts[1] if experts else 0,
    )
    machine["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    machine["clock"] = cal_args.clock
    return Calibration(
        model=facts,
        cost_flags=cost_flag_values(server_args),
        kv_pool_tokens=worker.pool.total_tokens,
        costs=costs,
        startup=Startup(process_start, model_load, warmup),
        fit_errors=errors,
        machine=machine,
        calibration_seconds=time.perf_counter() - began,
        kv_window_tokens=worker.pool.window_tokens,
        serving=serving,
    )


def main(ns: argparse.Namespace) -> int:
    try:
        cal_args = CalibrateArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(CalibrateArgs)})
        server_args = server_args_from(ns, CALIBRATE_SERVER_FLAGS)
        cal_args.validate(server_args.torch_threads, "overlap" if server_args.overlap_schedule else "normal")
    except ValueError as err:
        print(f"sluice calibrate: {err}", file=sys.stderr)
        return 2
    calibration = run_calibration(cal_args, server_args)
    calibration.save(Path(cal_args.output_file))
    for loop, kinds in calibration.fit_errors.items():
        if loop == "served_phase":
            continue
        parts = [f"{kind} {e['held_out']['mean']:.1%} (median {e['held_out']['median']:.1%})" for kind, e in kinds.items()]
        print(f"{loop} loop, held-out mean error: " + ", ".join(parts))
    print(f"calibration written to {cal_args.output_file} in {calibration.calibration_seconds:.0f} s")
    return 0
