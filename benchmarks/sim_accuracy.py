"""How close `sluice simulate` comes to the real server, on this machine, in one run.

    python -m benchmarks.sim_accuracy [--workloads all] [--trace] [--output-file acc.json]

1. `sluice calibrate` (the machine's step-time model and its served phase);
2. for each workload, once the 1-minute load average is under `--quiet-load` (0.5):
   `bench_serving --launch-server` (the real server, no peers), then `sluice simulate` with
   the same workload and server flags; with `--trace` both write their schedule traces and
   their tick-by-tick comparison is printed (`sim.trace_compare`);
3. a table of output throughput, mean TTFT and mean E2E, real against simulated, with the
   issue's bounds (15%, 30%, 20%), the machine's CPU and flags, and the load average
   before and after each run.

None of the workloads is one the calibration ran: it fits on its own request patterns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.runtime.sim.calibration import Calibration, cpu_identity
from sluice.runtime.sim.trace_compare import (
    REAL_WARMUPS,
    SIM_WARMUPS,
    Trace,
    compare,
    format_comparison,
)

ROOT = Path(__file__).resolve().parent.parent

BOUNDS = {"output_throughput": 0.15, "mean_ttft_ms": 0.30, "mean_e2e_latency_ms": 0.20}
EXTRA = ("mean_itl_ms", "p99_ttft_ms", "mean_tpot_ms")


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    flags: tuple[str, ...]
    server_flags: tuple[str, ...] = ()


_POISSON = (
    "--num-prompts",
    "48",
    "--random-input-len",
    "160",
    "--random-input-min",
    "80",
    "--random-output-len",
    "224",
    "--random-output-min",
    "32",
)
_SHARED = (
    "--dataset-name",
    "shared-prefix",
    "--num-prompts",
    "48",
    "--shared-prefix-len",
    "400",
    "--random-input-len",
    "128",
    "--random-output-len",
    "96",
    "--random-range-ratio",
    "0.33",
)

WORKLOADS = [
    Workload("burst", "64 requests at t=0, prompts 128-512, outputs 64-256",
             ("--num-prompts", "64", "--random-input-len", "512", "--random-output-len", "256",
              "--random-range-ratio", "0.25")),
    Workload("poisson-2rps", "48 requests, Poisson 2 req/s, prompts 80-160, outputs 32-224",
             (*_POISSON, "--request-rate", "2")),
    Workload("poisson-4rps", "48 requests, Poisson 4 req/s, prompts 80-160, outputs 32-224",
             (*_POISSON, "--request-rate", "4")),
    Workload("poisson-8rps", "48 requests, Poisson 8 req/s, prompts 80-160, outputs 32-224",
             (*_POISSON, "--request-rate", "8")),
    Workload("shared-prefix-burst", "48 requests at t=0 sharing a 400-token system prompt, own 42-128, "
             "outputs 31-96", _SHARED),
    Workload("shared-prefix-poisson", "48 requests, Poisson 4 req/s, sharing a 400-token system prompt, "
             "own 42-128, outputs 31-96", (*_SHARED, "--request-rate", "4")),
    Workload("multi-prefix", "48 requests, Poisson 3 req/s, 4 prefixes of 320 tokens (12 uses each), "
             "own 42-128, outputs 31-96",
             ("--dataset-name", "multi-prefix", "--num-prompts", "48", "--num-prefixes", "4",
              "--shared-prefix-len", "320", "--random-input-len", "128", "--random-output-len", "96",
              "--random-range-ratio", "0.33", "--request-rate", "3")),
    Workload("retraction", "48 requests at t=0, prompts 200-400, outputs 150-300, a 6000-token KV pool",
             ("--num-prompts", "48", "--random-input-len", "400", "--random-input-min", "200",
              "--random-output-len", "300", "--random-output-min", "150"),
             ("--max-total-tokens", "6000")),
    Workload("long-short", "48 requests at t=0: a quarter 500-2000-token prompts with 8-32-token answers, "
             "the rest 32-128-token prompts with 96-384-token answers",
             ("--dataset-name", "long-short", "--num-prompts", "48", "--long-fraction", "0.25",
              "--random-input-len", "2000", "--random-input-min", "128", "--random-output-len", "384",
              "--random-output-min", "32", "--random-range-ratio", "0.25")),
    Workload("concurrency-8", "40 requests, at most 8 in flight, prompts 64-256, outputs 128-256",
             ("--num-prompts", "40", "--random-input-len", "256", "--random-input-min", "64",
              "--random-output-len", "256", "--random-output-min", "128", "--max-concurrency", "8")),
]  # fmt: skip


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def wait_quiet(limit: float, timeout_s: float) -> list[float]:
    """Wait until the 1-minute load average is under `limit` (the run before this one, or
    anything else, has stopped weighing on the cores), at most `timeout_s`; returns the load
    then. A machine that stays loaded is reported, not waited on forever: the table shows
    the load before each run."""
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(5.0)
    return load()


def run(cmd: list[str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{tail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="all", help="comma-separated names, or all")
    p.add_argument(
        "--folder", default="benchmarks/results/sim_accuracy", help="where the runs' files go"
    )
    p.add_argument("--calibration", default="", help="use this calibration instead of calibrating")
    p.add_argument("--base-url", default="http://127.0.0.1:30517")
    p.add_argument("--output-file", default="", help="the table's numbers as JSON")
    p.add_argument(
        "--quiet-load",
        type=float,
        default=0.5,
        help="before each run, wait until the 1-minute load average is under this (0: do not wait)",
    )
    p.add_argument(
        "--quiet-timeout", type=float, default=300.0, help="... but at most this many seconds"
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=0,
        help="every workload with this many requests (0: its own)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="record both schedule traces and print their tick-by-tick comparison",
    )
    args = p.parse_args()
    if args.num_prompts < 0:
        p.error("--num-prompts must be >= 0")
    folder = ROOT / args.folder
    folder.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    chosen = (
        WORKLOADS
        if args.workloads == "all"
        else [w for w in WORKLOADS if w.name in args.workloads.split(",")]
    )
    if not chosen:
        p.error(f"--workloads: choose from {', '.join(w.name for w in WORKLOADS)} or all")
    if args.num_prompts:
        chosen = [with_prompts(w, args.num_prompts) for w in chosen]
    report: dict = {"machine": cpu_identity(), "load_average": {"start": load()}, "workloads": []}
    print(machine_line(report["machine"]), flush=True)
    cal = Path(args.calibration) if args.calibration else folder / "calibration.json"
    if not args.calibration:
        if args.quiet_load > 0:
            report["load_average"]["before_calibration"] = wait_quiet(
                args.quiet_load, args.quiet_timeout
            )
        t0 = time.perf_counter()
        run(
            [py, "-m", "sluice.runtime", "calibrate", "--output-file", str(cal)],
            folder / "calibrate.log",
        )
        report["calibration_seconds"] = time.perf_counter() - t0
        report["load_average"]["after_calibration"] = load()
        print(f"calibrated in {report['calibration_seconds']:.0f} s (load {load()})", flush=True)
    for w in chosen:
        slug = w.name.replace("/", "-")
        real, sim = folder / f"{slug}.bench.json", folder / f"{slug}.sim.json"
        real_trace, sim_trace = (
            folder / f"{slug}.real-trace.jsonl",
            folder / f"{slug}.sim-trace.jsonl",
        )
        traced = (
            (("--schedule-trace", str(real_trace)), ("--schedule-trace", str(sim_trace)))
            if args.trace
            else ((), ())
        )
        before = wait_quiet(args.quiet_load, args.quiet_timeout) if args.quiet_load > 0 else load()
        t0 = time.perf_counter()
        run([py, "-m", "benchmarks.bench_serving", "--launch-server", "--base-url", args.base_url,
             "--no-peer", "--no-gemm-ceiling", "--server-args", " ".join((*w.server_flags, *traced[0])),
             "--output-file", str(real), *w.flags], folder / f"{slug}.bench.log")  # fmt: skip
        bench_s = time.perf_counter() - t0
        after = load()
        t0 = time.perf_counter()
        run([py, "-m", "sluice.runtime", "simulate", "--calibration", str(cal), "--output-file", str(sim),
             *w.flags, *w.server_flags, *traced[1]], folder / f"{slug}.sim.log")  # fmt: skip
        sim_s = time.perf_counter() - t0
        r, s = json.loads(real.read_text())["sluice"], json.loads(sim.read_text())
        row = {"workload": w.name, "what": w.what, "load_before": before, "load_after": after,
               "bench_wall_s": bench_s, "simulate_wall_s": sim_s,
               "simulated_seconds_per_wall_second": s["simulation"]["simulated_seconds_per_wall_second"],
               "retractions": s["simulation"]["retractions_total"], "metrics": {}}  # fmt: skip
        for key in (*BOUNDS, *EXTRA):
            rv, sv = r.get(key), s["sluice"].get(key)
            err = (sv - rv) / rv if rv and sv is not None else None
            row["metrics"][key] = {"real": rv, "sim": sv, "error": err, "bound": BOUNDS.get(key)}
        report["workloads"].append(row)
        print(format_row(row), flush=True)
        if args.trace:
            calibration = Calibration.load(cal)
            ticks = compare(
                Trace.read(real_trace, REAL_WARMUPS),
                Trace.read(sim_trace, SIM_WARMUPS),
                calibration.costs.loop(s["simulation"]["loop"] == "overlap"),
            )
            row["ticks"] = ticks
            print(format_comparison(ticks), flush=True)
    report["load_average"]["end"] = load()
    print(machine_line(report["machine"]))
    print(format_table(report))
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def with_prompts(w: Workload, n: int) -> Workload:
    """`w` with `n` requests (the same lengths, rate and server flags)."""
    flags = list(w.flags)
    flags[flags.index("--num-prompts") + 1] = str(n)
    return Workload(w.name, f"{w.what} (here {n} requests)", tuple(flags), w.server_flags)


def machine_line(m: dict) -> str:
    return f"machine: {m['cpu']}, {m['cores']} cores, flags {' '.join(m['cpu_flags']) or '(no AVX-512/AMX)'}"


def format_row(row: dict) -> str:
    parts = []
    for key, m in row["metrics"].items():
        if m["error"] is not None and key in BOUNDS:
            ok = "ok" if abs(m["error"]) <= m["bound"] else "OUT"
            parts.append(f"{key} {m['real']:.1f} vs {m['sim']:.1f} ({m['error']:+.1%} {ok})")
    return (
        f"{row['workload']}: "
        + "; ".join(parts)
        + f" (load {row['load_before']} -> {row['load_after']})"
    )


def format_table(report: dict) -> str:
    lines = ["| workload | output tok/s real / sim (err) | mean TTFT ms real / sim (err) | "
             "mean E2E ms real / sim (err) | mean ITL ms real / sim | load avg (1 min) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for row in report["workloads"]:
        cells = []
        for key in ("output_throughput", "mean_ttft_ms", "mean_e2e_latency_ms", "mean_itl_ms"):
            m = row["metrics"][key]
            if m["real"] is None or m["sim"] is None:
                cells.append("n/a")
            elif key in BOUNDS:
                cells.append(f"{m['real']:.1f} / {m['sim']:.1f} ({m['error']:+.1%})")
            else:
                cells.append(f"{m['real']:.1f} / {m['sim']:.1f}")
        lines.append(f"| {row['workload']} | " + " | ".join(cells) +
                     f" | {row['load_before'][0]} → {row['load_after'][0]} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
