"""`sluice simulate` end to end on the tiny model with a calibration of known costs: the
workload is bench_serving's (same flags, same requests), the JSON has bench_serving's keys,
and the run is deterministic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.cli import main
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.workload.metrics import RequestResult, compute_metrics

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

WORKLOAD = ["--num-prompts", "8", "--random-input-len", "40", "--random-output-len", "12",
            "--request-rate", "4", "--seed", "3"]  # fmt: skip


@pytest.fixture(scope="module")
def calibration_file(tiny_llama_path, tmp_path_factory):
    worker = ModelWorker(server_args(tiny_llama_path), tiny_llama_path)
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    synthetic_calibration(worker).save(path)
    return path


def simulate(calibration_file: Path, out: Path, *extra: str) -> dict:
    assert main(["simulate", "--calibration", str(calibration_file), "--output-file", str(out),
                 *WORKLOAD, "--max-total-tokens", "4096", *extra]) == 0  # fmt: skip
    return json.loads(out.read_text())


def test_results_have_bench_servings_keys_and_count_every_token(calibration_file, tmp_path):
    doc = simulate(calibration_file, tmp_path / "sim.json")
    bench_keys = set(compute_metrics([RequestResult(1, 1, True, 1, 0.1, (), 0.2)], 1.0).to_dict())
    assert set(doc["sluice"]) == bench_keys | {"server_peak_rss_mib"}
    s = doc["sluice"]
    assert s["completed"] == 8 and s["failed"] == 0
    assert (
        s["total_output_tokens"] == doc["dataset"]["total_output_tokens"]
    )  # ignore_eos: all of them
    for key in (
        "output_throughput",
        "mean_ttft_ms",
        "p99_ttft_ms",
        "mean_itl_ms",
        "mean_e2e_latency_ms",
    ):
        assert s[key] > 0
    sim = doc["simulation"]
    assert sim["simulated_seconds_per_wall_second"] > 0 and sim["ticks"] > 0


def test_the_workload_is_bench_servings(calibration_file, tmp_path, tiny_llama_path):
    from benchmarks.bench_serving import BenchArgs
    from sluice.runtime.model.loader import load_tokenizer
    from sluice.runtime.workload.args import build_dataset
    from sluice.runtime.workload.dataset import DatasetSummary

    doc = simulate(calibration_file, tmp_path / "sim.json", "--dataset-name", "shared-prefix",
                   "--shared-prefix-len", "24")  # fmt: skip
    bench = BenchArgs.from_cli(
        [*WORKLOAD, "--dataset-name", "shared-prefix", "--shared-prefix-len", "24"]
    )
    requests, extras = build_dataset(bench, load_tokenizer(tiny_llama_path))
    from dataclasses import asdict

    assert doc["dataset"] == asdict(DatasetSummary.of(requests, **extras))
    assert doc["sluice"]["cached_tokens"] > 0  # the shared prefix hit the radix cache


def test_the_same_inputs_give_the_same_outputs(calibration_file, tmp_path):
    a = simulate(calibration_file, tmp_path / "a.json", "--max-concurrency", "3")
    b = simulate(calibration_file, tmp_path / "b.json", "--max-concurrency", "3")
    assert a["sluice"] == b["sluice"]
    assert a["sluice"]["peak_concurrency"] <= 3


def test_engine_flags_other_than_the_calibrations_are_refused(calibration_file, tmp_path, capsys):
    code = main(
        ["simulate", "--calibration", str(calibration_file), *WORKLOAD, "--quantization", "w8a8"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--quantization 'w8a8'" in err and "sluice calibrate" in err


def test_a_missing_calibration_is_a_clear_error(tmp_path, capsys):
    assert main(["simulate", "--calibration", str(tmp_path / "none.json")]) == 2
    assert "run `sluice calibrate` first" in capsys.readouterr().err


def test_flags_of_gives_back_the_values_the_parser_reads():
    import argparse

    from sluice.runtime.dataclass_cli import add_flags, flags_of
    from sluice.runtime.server_args import ServerArgs

    chosen = ServerArgs(model="m", max_total_tokens=6000, disable_radix_cache=True, schedule_policy="lpm",
                        cpu_kv_cache_gib=0.5)  # fmt: skip
    names = (
        "model",
        "max_total_tokens",
        "disable_radix_cache",
        "schedule_policy",
        "cpu_kv_cache_gib",
        "page_size",
    )
    parser = argparse.ArgumentParser()
    add_flags(parser, ServerArgs, only=names)
    flags = flags_of(chosen, names)
    assert "--page-size" not in flags  # left at its default
    ns = parser.parse_args(flags)
    assert {n: getattr(ns, n) for n in names} == {n: getattr(chosen, n) for n in names}


def test_flags_of_refuses_a_value_no_flag_can_give():
    from dataclasses import dataclass

    from sluice.runtime.dataclass_cli import flags_of, option

    @dataclass(frozen=True)
    class OnByDefault:
        warm: bool = option(True, "on unless ...")

    assert flags_of(OnByDefault()) == []
    with pytest.raises(ValueError, match="--warm defaults to True"):
        flags_of(OnByDefault(warm=False))


def test_a_calibration_from_another_cpu_or_model_is_refused_in_one_line(
    calibration_file, tmp_path, capsys
):
    import dataclasses

    from sluice.runtime.sim.calibration import Calibration, cpu_identity

    here = cpu_identity()
    cal = Calibration.load(calibration_file)
    other = dataclasses.replace(
        cal, machine={**here, "cpu": "Some Other CPU", "cpu_flags": ["avx2"]}
    )
    path = tmp_path / "other.json"
    other.save(path)
    for command in (
        ["simulate", "--calibration", str(path), *WORKLOAD],
        ["plan", "--calibration", str(path)],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "another CPU" in err and "Some Other CPU" in err, err
    # explicitly asked: simulate the calibrated machine
    out = tmp_path / "sim.json"
    assert main(["simulate", "--calibration", str(path), "--allow-other-cpu", "--output-file", str(out),
                 *WORKLOAD, "--max-total-tokens", "4096"]) == 0  # fmt: skip
    # the same CPU passes; another model is refused
    same = dataclasses.replace(
        cal, machine=here, model=dataclasses.replace(cal.model, config_sha256="0" * 64)
    )
    same.save(path)
    capsys.readouterr()
    assert (
        main(["simulate", "--calibration", str(path), "--model-path", cal.model.path, *WORKLOAD])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another model" in err, err


def test_calibrate_records_what_its_calibration_holds_for():
    import os
    from pathlib import Path

    from sluice.runtime.sim.calibration import PERF_CPU_FLAGS, cpu_identity

    here = cpu_identity()
    # against the kernel's own record: the first flags line and model name of /proc/cpuinfo
    text = Path("/proc/cpuinfo").read_text()
    flags = set(
        next(line for line in text.splitlines() if line.startswith("flags"))
        .split(":", 1)[1]
        .split()
    )
    name = (
        next(line for line in text.splitlines() if line.startswith("model name"))
        .split(":", 1)[1]
        .strip()
    )
    assert here["cpu_flags"] == [f for f in PERF_CPU_FLAGS if f in flags]
    assert (here["cpu"], here["cores"]) == (name, os.cpu_count())


def test_a_p_d_pair_serves_the_same_workload_and_its_decode_side_computes_no_prompt(
    calibration_file, tmp_path
):
    one = simulate(calibration_file, tmp_path / "one.json")
    pd = simulate(
        calibration_file, tmp_path / "pd.json", "--pd-disaggregation", "--pd-transfer-gbps", "1"
    )
    assert (
        pd["simulation"]["topology"] == "prefill+decode"
        and one["simulation"]["topology"] == "one server"
    )
    assert pd["sluice"]["completed"] == 8 and pd["sluice"]["failed"] == 0
    assert pd["sluice"]["total_output_tokens"] == one["sluice"]["total_output_tokens"]
    assert pd["simulation"]["decode_computed_prompt_tokens"] == 0
    again = simulate(
        calibration_file, tmp_path / "pd2.json", "--pd-disaggregation", "--pd-transfer-gbps", "1"
    )
    assert again["sluice"] == pd["sluice"]  # deterministic


def test_p_d_flags_are_checked(calibration_file, tmp_path, capsys):
    assert main(["simulate", "--calibration", str(calibration_file), *WORKLOAD, "--pd-disaggregation",
                 "--schedule-trace", str(tmp_path / "t.jsonl")]) == 2  # fmt: skip
    assert "not with --pd-disaggregation" in capsys.readouterr().err
    assert (
        main(
            [
                "simulate",
                "--calibration",
                str(calibration_file),
                *WORKLOAD,
                "--pd-transfer-gbps",
                "0",
            ]
        )
        == 2
    )
