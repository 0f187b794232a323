"""`sluice router --pd-disaggregation` flags: `--prefill URL [BOOTSTRAP_PORT]` and
`--decode URL`, repeatable, rendered back by `flags_of`, and each misuse refused clearly."""

from __future__ import annotations

import pytest

from sluice.runtime import constants as C
from sluice.runtime.cli import build_parser, main
from sluice.runtime.dataclass_cli import flags_of
from sluice.runtime.router.args import PrefillServer, RouterArgs

PD = ["router", "--pd-disaggregation"]


def parsed(argv: list[str]) -> RouterArgs:
    return RouterArgs.from_cli_args(build_parser(router_only=True).parse_args(argv))


def test_prefill_servers_take_an_optional_bootstrap_port_and_decode_servers_repeat():
    args = parsed([*PD, "--prefill", "http://p1:30000/", "9000", "--prefill", "http://p2:30000",
                   "--decode", "http://d1:30000", "--decode", "http://d2:30000"])  # fmt: skip
    assert args.pd_disaggregation
    assert args.prefill_servers == (
        PrefillServer("http://p1:30000", 9000),
        PrefillServer("http://p2:30000", C.DISAGG_DEFAULT_BOOTSTRAP_PORT),
    )
    assert [s.bootstrap for s in args.prefill_servers] == ["p1:9000", f"p2:{8998}"]
    assert args.decode == ("http://d1:30000", "http://d2:30000")


def test_an_ipv6_prefill_servers_bootstrap_host_is_bracketed():
    assert PrefillServer("http://[fd00::1]:30000", 9000).bootstrap == "[fd00::1]:9000"


def test_flags_of_renders_the_p_d_flags_back_to_the_same_args():
    args = parsed([*PD, "--prefill", "http://p1:30000", "9000", "--prefill", "http://p2:30000",
                   "--decode", "http://d1:30000"])  # fmt: skip
    assert parsed(["router", *flags_of(args)]) == args


def test_a_router_without_p_d_is_unchanged():
    args = parsed(["router", "--worker-urls", "http://a:1"])
    assert not args.pd_disaggregation and args.prefill == () and args.decode == ()
    assert flags_of(args) == ["--worker-urls", "http://a:1"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["router", "--worker-urls", "http://a:1", "--prefill", "http://p:1"],
         "--prefill/--decode need --pd-disaggregation"),
        (["router", "--decode", "http://d:1"], "--prefill/--decode need --pd-disaggregation"),
        ([*PD, "--decode", "http://d:1"],
         "needs prefill servers: give --prefill or --discover-prefill-selector"),
        ([*PD, "--prefill", "http://p:1"],
         "needs decode servers: give --decode or --discover-decode-selector"),
        ([*PD, "--prefill", "p:1", "--decode", "http://d:1"],
         "--prefill: 'p:1' is not an http(s)://host:port URL"),
        ([*PD, "--prefill", "http://p:1", "--decode", "ftp://d:1"],
         "--decode: 'ftp://d:1' is not an http(s)://host:port URL"),
        ([*PD, "--prefill", "9000", "--decode", "http://d:1"], "port 9000 follows no URL"),
        ([*PD, "--prefill", "http://p:1", "9000", "9001", "--decode", "http://d:1"],
         "port 9001 follows no URL"),
        ([*PD, "--prefill", "http://p:1", "70000", "--decode", "http://d:1"],
         "bootstrap port 70000 is not in 1..65535"),
        ([*PD, "--prefill", "http://p:1", "--decode", "http://p:1"], "a URL is given twice"),
        ([*PD, "--prefill", "http://p:1", "--decode", "http://d:1", "--worker-urls", "http://w:1"],
         "not --worker-urls"),
        ([*PD, "--prefill", "http://p:1", "--decode", "http://d:1", "--discover-selector", "a=b"],
         "--pd-disaggregation does not take --discover-selector: use "
         "--discover-prefill-selector and --discover-decode-selector"),
    ],
)  # fmt: skip
def test_misused_p_d_flags_exit_2_with_the_problem_named(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
