"""Serving benchmark for Sluice, in the style of SGLang's `bench_serving`.

Sends a random (or shared-prefix) dataset to a running server's streaming
`/v1/completions`, measures TTFT, ITL, TPOT and E2E per request and throughput overall,
then runs Hugging Face transformers' `generate` (static batching) on the same prompts as a
peer and prints the ratio. See benchmarks/README.md.

    python -m benchmarks.bench_serving --launch-server --num-prompts 64 \
        --random-input-len 512 --random-output-len 256 --random-range-ratio 0.25
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import resource
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.serving import ceiling, client, dataset, llamacpp_peer, metrics, report  # noqa: E402
from benchmarks.serving import peer as hf_peer  # noqa: E402
from sluice.runtime import constants as C  # noqa: E402
from sluice.runtime.dataclass_cli import add_flags, option  # noqa: E402
from sluice.runtime.workload.args import WorkloadArgs, build_dataset  # noqa: E402

PEER_NAMES = (*hf_peer.HF_PEERS, *llamacpp_peer.LLAMACPP_PEERS)


@dataclass(frozen=True)
class BenchArgs(WorkloadArgs):
    """The workload's flags (`WorkloadArgs`, shared with `sluice simulate`), then the run's."""

    backend: str = option(
        "sluice", "Server kind; the payload is OpenAI completions plus ignore_eos.", ("sluice",)
    )
    base_url: str = option(f"http://{C.DEFAULT_HOST}:{C.DEFAULT_PORT}", "Server address.")
    launch_server: bool = option(
        False,
        "Start `python -m sluice.runtime serve` on --base-url's port, "
        "run, then stop it (SIGTERM, then kill).",
    )
    server_args: str = option("", "Extra flags for the launched server, as one string.")
    server_timeout: float = option(900.0, "Seconds to wait for the launched server's /health.")
    model: str = option(
        C.BUNDLED_MODEL_NAME,
        "Model the server serves (a folder or the bundled name); --launch-server serves it.",
    )
    model_path: str = option(
        "",
        "Local Hugging Face folder for the tokenizer and the peer "
        "(default: --model's folder, or the bundled model's cache).",
    )
    model_cache_dir: str = option(
        "",
        "The server's --model-cache-dir, where the bundled model is converted to "
        "(default: the runtime's, ~/.cache/sluice); passed on to a launched server.",
    )
    served_model_name: str = option("", "`model` field of requests (default: from GET /v1/models).")
    api_key: str = option("", f"Bearer token for the server (also ${C.ENV_API_KEY}).")
    extra_request_body: str = option("", "JSON object merged into every request body.")
    warmup_requests: int = option(1, "Short requests sent before the clock starts.")
    output_file: str = option("", "Write the results as JSON here.")
    output_details: bool = option(False, "Add every request's timings and text to the JSON.")
    peer: str = option(
        "hf",
        "Peers run on the same prompts after the server run, comma-separated: "
        f"{', '.join(PEER_NAMES)}; hf = hf-fp32,hf-bf16; none = no peer.",
    )
    peer_batch_size: int = option(
        0,
        "transformers peers' static batch size (0: --max-concurrency if set, else every "
        "request in one batch when it fits, else the fewest equal batches that do).",
    )
    peer_threads: int = option(0, "Threads for the peers (0: every core this process may use).")
    no_gemm_ceiling: bool = option(
        False, "Skip the GEMM ceilings (measured after the server run, with Sluice's fraction)."
    )
    peer_device: str = option(
        "cpu", "Where the transformers peers run: cpu, or cuda (bf16 on the server's GPU).", ("cpu", "cuda")
    )
    router_policy: str = option(
        "", "Send through `sluice router` with this policy: with --launch-server, start "
        "--num-workers servers on the ports after --base-url's and a router on --base-url; "
        "without it, --base-url is a running router.", ("", *C.ROUTER_POLICIES),
    )
    num_workers: int = option(2, "--router-policy with --launch-server: servers to start.")
    router_args: str = option("", "Extra flags for the launched router, as one string.")
    overhead_probes: int = option(
        0, "--router-policy: after the run, this many short requests through the router, each "
        "followed by the same straight to the worker it chose: the router's added latency.",
    )

    def validate(self) -> None:
        problems = self.workload_problems()
        if self.num_workers < 1 or self.overhead_probes < 0:
            problems.append("--num-workers must be >= 1 and --overhead-probes >= 0")
        if self.overhead_probes and not self.router_policy:
            problems.append("--overhead-probes needs --router-policy")
        unknown = [p for p in self.peer_names() if p not in PEER_NAMES]
        if unknown:
            problems.append(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEER_NAMES)}")
        if self.extra_request_body:
            try:
                if not isinstance(json.loads(self.extra_request_body), dict):
                    problems.append("--extra-request-body must be a JSON object")
            except json.JSONDecodeError as exc:
                problems.append(f"--extra-request-body is not JSON: {exc}")
        if problems:
            raise ValueError("; ".join(problems))

    @staticmethod
    def parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        add_flags(parser, BenchArgs)
        parser.add_argument(
            "--no-peer",
            dest="peer",
            action="store_const",
            const="none",
            help="Skip the peer (same as --peer none).",
        )
        return parser

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> BenchArgs:
        parser = cls.parser()
        ns = parser.parse_args(argv)
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}
        if not values["api_key"]:
            values["api_key"] = os.environ.get(C.ENV_API_KEY, "")
        args = cls(**values)
        try:
            args.validate()
        except ValueError as exc:
            parser.error(str(exc))
        return args

    def peer_names(self) -> list[str]:
        names: list[str] = []
        for name in (n.strip() for n in self.peer.split(",")):
            if name in ("", "none"):
                continue
            names += list(hf_peer.HF_PEERS) if name == "hf" else [name]
        return list(dict.fromkeys(names))

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "api_key"}


def resolve_model_path(args: BenchArgs) -> Path:
    """The local folder holding the tokenizer and the weights the server serves."""
    if args.model_path:
        return Path(args.model_path)
    if Path(args.model).is_dir():
        return Path(args.model)
    try:  # the runtime's own resolution: the bundled name or a GGUF file -> its cache folder
        from sluice.runtime.cache_dir import default_cache_dir
        from sluice.runtime.model.loader import resolve_model_path as runtime_resolve
    except ImportError as exc:
        raise SystemExit(
            f"cannot find the folder of model {args.model!r} ({exc}); pass --model-path"
        ) from exc
    cache_dir = Path(args.model_cache_dir) if args.model_cache_dir else default_cache_dir()
    return Path(runtime_resolve(args.model, cache_dir))


async def run_serving(
    args: BenchArgs, requests: list[dataset.BenchRequest], warmup: dataset.BenchRequest
) -> tuple[list[metrics.RequestResult], float]:
    model = args.served_model_name or await client.fetch_model_id(args.base_url, args.api_key)
    config = client.LoadConfig(
        url=args.base_url.rstrip("/") + client.COMPLETIONS_PATH,
        model=model or args.model,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        ignore_eos=not args.disable_ignore_eos,
        seed=args.seed,
        api_key=args.api_key,
        extra_body=json.loads(args.extra_request_body) if args.extra_request_body else {},
    )
    print(f"model {config.model!r} at {config.url}; warm-up: {args.warmup_requests} request(s)")
    await client.warm_up(config, warmup, args.warmup_requests)
    print(
        f"sending {len(requests)} requests (rate {args.request_rate}, "
        f"max concurrency {args.max_concurrency or 'not set'})",
        flush=True,
    )
    return await client.run_load(config, requests)


def _process_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure_server(
    args: BenchArgs, requests: list[dataset.BenchRequest], warmup: dataset.BenchRequest
) -> tuple[list[metrics.RequestResult], float, float | None, dict[str, Any] | None]:
    """The server run: results, duration, the launched server's peak RSS (None when the
    server is not ours to measure), and with --router-policy what the router reports."""
    if not args.launch_server:
        results, duration = asyncio.run(run_serving(args, requests, warmup))
        routed = None
        if args.router_policy:
            from benchmarks.serving import router

            workers = router.router_worker_urls(args.base_url)
            routed = report_router(args, warmup, workers)
        return results, duration, None, routed
    from benchmarks.serving.server import launched_server, serve_command

    extra = args.server_args
    if args.model_cache_dir:
        extra += f" --model-cache-dir {shlex.quote(args.model_cache_dir)}"
    if args.router_policy:
        from benchmarks.serving import router

        with router.launched_fleet(
            args.model, args.base_url, args.num_workers, args.router_policy, extra,
            shlex.split(args.router_args), args.server_timeout,
        ) as workers:  # fmt: skip
            results, duration = asyncio.run(run_serving(args, requests, warmup))
            return results, duration, None, report_router(args, warmup, workers)
    command = serve_command(args.model, args.base_url, extra)
    with launched_server(command, args.base_url, args.server_timeout) as server:
        results, duration = asyncio.run(run_serving(args, requests, warmup))
        return results, duration, server.peak_rss_mib(), None


def report_router(
    args: BenchArgs, warmup: dataset.BenchRequest, workers: list[str]
) -> dict[str, Any]:
    """Requests per worker and decisions from the router, then the overhead probes."""
    from benchmarks.serving import router

    counts = router.router_counts(args.base_url)  # before the probes: the load's requests
    print(f"router ({args.router_policy}): requests per worker {counts['requests']}, "
          f"decisions {counts['decisions']}, its own share of TTFT (ms, from "
          f"{C.METRIC_ROUTER_OVERHEAD_SECONDS}) {counts['overhead_ms']}")  # fmt: skip
    out: dict[str, Any] = {"policy": args.router_policy, **counts}
    if args.overhead_probes:
        config = client.LoadConfig(
            url="", model=args.served_model_name or C.BUNDLED_SERVED_NAME, api_key=args.api_key
        )
        model = asyncio.run(client.fetch_model_id(args.base_url, args.api_key))
        config = dataclasses.replace(config, model=model or config.model)
        overhead = router.measure_overhead(
            args.base_url, workers, config, warmup, args.overhead_probes
        )
        print(f"router added latency over {overhead.probes} probes: TTFT p50 "
              f"{overhead.ttft_p50_ms:.2f} ms, p99 {overhead.ttft_p99_ms:.2f} ms; E2E p50 "
              f"{overhead.e2e_p50_ms:.2f} ms, p99 {overhead.e2e_p99_ms:.2f} ms")  # fmt: skip
        out["added_latency"] = dataclasses.asdict(overhead)
    return out


def run_notes(
    args: BenchArgs, served: metrics.ServingMetrics, peer_setups: dict[str, str]
) -> list[str]:
    """What a reader of the numbers must know; `peer_setups` describes each peer run."""
    where = (
        "the launched server was stopped before the peers started"
        if args.launch_server
        else "the external server stayed up, idle"
    )
    notes = [f"The server and the peers ran one after another, not at the same time ({where})."]
    notes += [f"Peer {name}: {setup}" for name, setup in peer_setups.items()]
    if peer_setups and not math.isinf(args.request_rate):
        notes.append("The peers ignore --request-rate: all their requests arrive at t=0.")
    if served.output_len_mismatches:
        notes.append(
            f"{served.output_len_mismatches} server request(s) returned a different number "
            "of tokens than asked; throughputs compare unequal work."
        )
    if served.usage_missing:
        notes.append(
            f"{served.usage_missing} stream(s) had no usage chunk; their output tokens were "
            "counted as text chunks."
        )
    return notes


def run_peer(
    name: str, args: BenchArgs, model_path: Path, requests: list[dataset.BenchRequest]
) -> tuple[metrics.PeerMetrics, str]:
    """One peer on the dataset: its metrics and a line saying how it ran."""
    threads = args.peer_threads or hf_peer.available_cores()
    if name in hf_peer.HF_PEERS:
        device = args.peer_device
        dtype = "bfloat16" if device == "cuda" else hf_peer.HF_PEERS[name]
        batch_size = hf_peer.peer_batch_size(args.peer_batch_size, args.max_concurrency, requests)
        batches = hf_peer.run_hf_peer(
            model_path, requests, batch_size, threads, device=device, dtype=dtype
        )
        setup = (
            f"transformers generate, {dtype} on {device}, {threads} torch threads, static "
            f"batches of {batch_size} in arrival order, left padding, greedy, each batch "
            "generating its longest request's length."
        )
        return metrics.compute_peer_metrics(batches, batch_size), setup
    gguf = llamacpp_peer.gguf_for(name, args.model, Path(args.model_cache_dir or "") or None)
    batches = llamacpp_peer.run_llamacpp_peer(gguf, requests, threads)
    setup = (
        f"llama.cpp (llama-cpp-python) on {gguf.name}, {threads} threads, all {len(requests)} "
        "sequences batched through llama_decode, greedy, each to its own length."
    )
    return metrics.compute_peer_metrics(batches, len(requests)), setup


def main(argv: list[str] | None = None) -> int:
    args = BenchArgs.from_cli(argv)
    from transformers import AutoTokenizer

    model_path = resolve_model_path(args)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    requests, extras = build_dataset(args, tokenizer)
    warmup = dataset.warmup_request(tokenizer, args.seed)
    summary = dataset.DatasetSummary.of(requests, **extras)
    print(report.format_dataset(args.dataset_name, summary), flush=True)

    results, duration, server_rss, routed = measure_server(args, requests, warmup)
    served = metrics.compute_metrics(results, duration)
    serving_table = report.format_serving(
        served, args.backend, args.request_rate, args.max_concurrency, server_rss
    )
    print(serving_table, flush=True)
    failures = [r.error for r in results if not r.success]
    if failures:
        print(f"{len(failures)} request(s) failed; first error: {failures[0]}")

    ceilings = None
    if not args.no_gemm_ceiling:
        threads = args.peer_threads or hf_peer.available_cores()
        ceilings = ceiling.measure_ceilings(model_path, threads)
        print(report.format_ceilings(ceilings, served.total_throughput, served.output_throughput),
              flush=True)  # fmt: skip

    peers: dict[str, metrics.PeerMetrics] = {}
    setups: dict[str, str] = {}
    for name in args.peer_names():
        try:
            peers[name], setups[name] = run_peer(name, args, model_path, requests)
        except llamacpp_peer.PeerUnavailable as err:
            print(f"peer {name} skipped: {err}", flush=True)
            setups[name] = f"not run ({err})"
            continue
        print(report.format_peer(peers[name], _process_peak_rss_mib(), title=name), flush=True)
    ratios = {name: metrics.compare(served, m) for name, m in peers.items()}
    if ratios:
        print(report.format_comparisons(ratios))
    notes = run_notes(args, served, setups)
    print(report.format_notes(notes))

    if args.output_file:
        details = results if args.output_details else None
        best = max(
            (n for n in peers if n in hf_peer.HF_PEERS),
            key=lambda n: peers[n].output_throughput,
            default=None,
        )
        doc = report.result_document(
            args.to_dict(), summary, served, server_rss,
            peers[best] if best else None, _process_peak_rss_mib() if peers else None,
            ratios[best] if best else None, notes, details,
            peers={n: m.to_dict() for n, m in peers.items()}, all_ratios=ratios,
            ceilings=ceiling.to_dicts(ceilings) if ceilings else None,
        )  # fmt: skip
        if routed is not None:
            doc["router"] = routed
        report.write_json(Path(args.output_file), doc)
        print(f"results written to {args.output_file}")
    return 0 if served.completed == len(requests) else 1


if __name__ == "__main__":
    sys.exit(main())
