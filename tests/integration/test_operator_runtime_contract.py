"""The command the operator renders into a pod is one the runtime's CLI accepts, and means
what the operator meant: every sample and every spec the builder tests use, parsed by the
runtime's own parser; the operator's managed flags are real runtime flags; and what the
operator refuses in `extraArgs` the runtime would not misread either."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from sluice.operator.builders.deployment import build_deployment
from sluice.operator.parsing import MANAGED_FLAGS, abbreviates, parse_spec
from sluice.runtime.cli import build_parser
from sluice.runtime.server_args import ServerArgs

sys.path.insert(0, str(Path(__file__).parents[1] / "operator"))
from operator_testkit import SPEC_MATRIX  # noqa: E402

SAMPLES = sorted((Path(__file__).parents[2] / "samples").glob("*.yaml"))
SPECS = [(f"sample-{p.stem}", yaml.safe_load(p.read_text())["spec"]) for p in SAMPLES] + [
    (f"matrix-{name}", spec) for name, spec in SPEC_MATRIX
]


def runtime_command(spec: dict) -> list[str]:
    isvc = parse_spec("demo", "default", spec, default_image="sluice:test")
    pod = build_deployment(isvc)["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == "runtime"]
    return [*container.get("command", []), *container.get("args", [])]


def parsed(command: list[str]) -> ServerArgs:
    assert command[:2] == ["sluice", "serve"], command
    return ServerArgs.from_cli_args(build_parser().parse_args(command[1:]))


@pytest.mark.parametrize("spec", [s for _, s in SPECS], ids=[i for i, _ in SPECS])
def test_every_rendered_command_parses_with_the_runtimes_parser(spec):
    isvc = parse_spec("demo", "default", spec, default_image="sluice:test")
    args = parsed(runtime_command(spec))
    assert args.host == "0.0.0.0" and args.port == 30000
    assert args.device == isvc.resources.device
    assert args.tensor_parallel_size == isvc.runtime.tensor_parallel_size
    assert args.startup_timeout == isvc.startup_timeout_seconds
    assert args.drain_timeout == isvc.termination_grace_period_seconds - 10  # preStop + exit


def test_runtime_options_reach_the_runtime():
    spec = {
        "model": {"source": "bundled://smollm2-135m"},
        "resources": {"gpus": 0},
        "runtime": {"pageSize": 16, "maxRunningRequests": 32, "chunkedPrefillSize": 512,
                    "schedulePolicy": "lpm", "overlapSchedule": False, "dtype": "float32"},
        "terminationGracePeriodSeconds": 300,
        "startupTimeoutSeconds": 600,
    }  # fmt: skip
    args = parsed(runtime_command(spec))
    assert (args.page_size, args.max_running_requests, args.chunked_prefill_size) == (16, 32, 512)
    assert args.schedule_policy == "lpm" and args.disable_overlap_schedule
    assert args.model == "smollm2-135m" and args.device == "cpu"
    assert (args.drain_timeout, args.startup_timeout) == (290, 600)


def serve_flags() -> set[str]:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return {flag for action in serve._actions for flag in action.option_strings}


def test_every_managed_flag_is_a_runtime_flag():
    assert set(MANAGED_FLAGS) <= serve_flags()


@pytest.mark.parametrize("arg", ["--por=8081", "--hos=0.0.0.0", "--devic=cuda", "--drain=1"])
def test_an_abbreviation_is_refused_by_the_runtime_and_by_the_operator(arg, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", arg])
    assert exited.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    assert abbreviates(arg) is not None


def test_the_operator_refuses_exactly_the_prefixes_argparse_would_expand():
    """With abbreviations on (an older runtime image), argparse reads a prefix of one flag
    as that flag; the operator refuses every prefix of a managed flag and nothing else."""
    import argparse

    permissive = argparse.ArgumentParser(allow_abbrev=True, add_help=False)
    for flag in sorted(serve_flags()):
        permissive.add_argument(flag, dest=flag, default=None)
    for flag in MANAGED_FLAGS:
        for end in range(3, len(flag) + 1):
            prefix = flag[:end]
            try:
                namespace = vars(permissive.parse_args([f"{prefix}=v"]))
            except SystemExit:
                continue  # ambiguous: argparse refuses it too
            expanded = next(k for k, v in namespace.items() if v == "v")
            assert expanded in MANAGED_FLAGS or abbreviates(prefix) is not None, prefix
            if expanded in MANAGED_FLAGS:
                assert abbreviates(f"{prefix}=v") is not None, prefix
