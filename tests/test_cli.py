"""`sluice serve` flags: each documented, defaults that work, bad values refused clearly."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from sluice.runtime.cli import build_parser, main
from sluice.runtime.server_args import ServerArgs

ISSUE_FLAGS = ["--model", "--host", "--port", "--device", "--dtype", "--page-size",
               "--max-total-tokens", "--max-running-requests", "--max-prefill-tokens",
               "--chunked-prefill-size", "--schedule-policy", "--api-key"]  # fmt: skip


def test_every_server_arg_is_a_flag_with_help_text():
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for f in dataclasses.fields(ServerArgs):
        assert "--" + f.name.replace("_", "-") in help_text
        assert f.metadata["help"]
    for flag in ISSUE_FLAGS:
        assert flag in help_text


def test_defaults_parse_into_valid_args():
    ns = build_parser().parse_args(["serve"])
    args = ServerArgs.from_cli_args(ns)
    assert args.port == 30000 and args.host == "127.0.0.1" and args.model == "smollm2-135m"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--page-size", "0"], "--page-size"),
        (["serve", "--max-running-requests", "-1"], "--max-running-requests"),  # 0 is auto
        (["serve", "--mem-fraction-static", "1.5"], "--mem-fraction-static"),
        (["serve", "--tensor-parallel-size", "0"], "--tensor-parallel-size"),
    ],
)
def test_bad_values_exit_2_with_the_flag_named(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_choice_is_refused_by_argparse():
    proc = subprocess.run([sys.executable, "-m", "sluice.runtime", "serve", "--schedule-policy", "nope"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.parametrize(
    "device, flags, overlap",
    [
        ("cpu", [], False),  # the CPU default: the normal loop (measured faster there)
        ("cuda", [], True),
        ("cpu", ["--enable-overlap-schedule"], True),
        ("cuda", ["--disable-overlap-schedule"], False),
        ("cpu", ["--enable-overlap-schedule", "--disable-overlap-schedule"], False),
    ],
)
def test_the_loop_is_chosen_by_device_unless_a_flag_says(device, flags, overlap):
    ns = build_parser().parse_args(["serve", "--model", "m", "--device", device, *flags])
    args = ServerArgs.from_cli_args(ns)
    chosen, why = args.overlap_choice
    assert chosen is overlap and args.overlap_schedule is overlap
    assert why  # logged at start-up
