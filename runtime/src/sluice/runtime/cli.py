"""`sluice` command line: `serve` and `router` (the runtime), and `calibrate`, `simulate`
and `plan` (capacity planning on the real scheduler, `sluice.runtime.sim`).

`sluice router ...` builds only the router's parser: the simulator's subcommands import
numpy for their flags, and the router image (Dockerfile target `router`) has neither
numpy nor torch. Nothing on the router's path imports them (tests/chart/test_dockerfile.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from sluice.runtime.process_exit import exit_now
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.server_args import ServerArgs

ROUTER = "router"


def build_parser(*, router_only: bool = False) -> argparse.ArgumentParser:
    """Every command, or with `router_only` just `router` (what `sluice router` parses: the
    same flags, without building the other commands)."""
    # allow_abbrev=False: `--por=1` must not be read as `--port=1` (the operator sets some
    # flags itself and refuses them in extraArgs; an abbreviation would slip past)
    parser = argparse.ArgumentParser(
        prog="sluice", description="Sluice LLM serving runtime", allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True)
    if not router_only:
        serve = sub.add_parser(
            "serve", help="serve a model with an OpenAI-compatible API", allow_abbrev=False
        )
        ServerArgs.add_cli_args(serve)
    router = sub.add_parser(ROUTER, help="route requests across several runtime servers")
    RouterArgs.add_cli_args(router)
    if not router_only:
        from sluice.runtime.sim import cli as sim_cli  # flags only, but they import numpy

        sim_cli.add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ns = build_parser(router_only=argv[:1] == [ROUTER]).parse_args(argv)
    if ns.command == "serve":
        try:
            args = ServerArgs.from_cli_args(ns)
        except ValueError as err:
            print(f"sluice serve: {err}", file=sys.stderr)
            return 2
        from sluice.runtime.launch import launch_server  # heavy imports only when serving

        return launch_server(args)
    if ns.command == ROUTER:
        try:
            router_args = RouterArgs.from_cli_args(ns)
        except ValueError as err:
            print(f"sluice router: {err}", file=sys.stderr)
            return 2
        from sluice.runtime.router.server import run_router  # no model, no torch

        return run_router(router_args)
    from sluice.runtime.sim import cli as sim_cli

    if ns.command in sim_cli.COMMANDS:
        return sim_cli.run(ns)
    return 2


def entry() -> NoReturn:
    """The `sluice` command: `main`, then the process ends without the interpreter's
    teardown (`process_exit`)."""
    exit_now(main())


if __name__ == "__main__":
    entry()
