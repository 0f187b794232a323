"""`sluice router` flags: each documented, defaults that work, bad values refused clearly."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.runtime.cli import build_parser, main
from sluice.runtime.router.args import RouterArgs

ISSUE_FLAGS = ["--host", "--port", "--worker-urls", "--policy", "--discover-selector",
               "--discover-namespace"]  # fmt: skip


def test_every_router_arg_is_a_flag_with_help_text():
    help_text = build_parser()._subparsers._group_actions[0].choices["router"].format_help()
    for f in dataclasses.fields(RouterArgs):
        assert "--" + f.name.replace("_", "-") in help_text
        assert f.metadata["help"]
    for flag in ISSUE_FLAGS:
        assert flag in help_text


def test_worker_urls_take_several_values():
    ns = build_parser().parse_args(
        ["router", "--worker-urls", "http://a:1/", "http://b:2", "--policy", "round-robin"]
    )
    args = RouterArgs.from_cli_args(ns)
    assert args.worker_urls == ("http://a:1", "http://b:2") and args.policy == "round-robin"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["router"], "--worker-urls, or --discover-selector"),
        (["router", "--worker-urls", "a:1"], "is not an http(s)://host:port URL"),
        (["router", "--worker-urls", "http://a:1", "http://a:1"], "given twice"),
        (["router", "--worker-urls", "http://a:1", "--cache-threshold", "2"], "--cache-threshold"),
        (["router", "--discover-selector", "app!=x"], "equality selectors only"),
        (["router", "--worker-urls", "http://a:1", "--retry-backoff-initial", "0"], "backoff"),
    ],
)
def test_bad_values_exit_2_with_the_problem_named(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_policy_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["router", "--policy", "sticky"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err
