"""The simulator's subcommands of `sluice`: their flags, and what runs them. Imports here
stay light (flags only); each command imports what it needs when it runs."""

from __future__ import annotations

import argparse
from typing import Any

COMMANDS = ("calibrate", "simulate", "plan")


def add_subcommands(sub: Any) -> None:
    from sluice.runtime.sim import calibrate

    p = sub.add_parser(
        "calibrate", allow_abbrev=False,
        help="measure this machine's engine and fit the simulator's step-time model",
    )  # fmt: skip
    calibrate.add_parser_args(p)
    from sluice.runtime.sim import simulate

    p = sub.add_parser(
        "simulate", allow_abbrev=False,
        help="run bench_serving's workload through the real scheduler on a virtual clock",
    )  # fmt: skip
    simulate.add_parser_args(p)
    from sluice.runtime.sim.plan import command as plan

    p = sub.add_parser(
        "plan", allow_abbrev=False,
        help="simulate replicas under autoscaling policies over a traffic trace",
    )  # fmt: skip
    plan.add_parser_args(p)


def run(ns: argparse.Namespace) -> int:
    if ns.command == "calibrate":
        from sluice.runtime.sim import calibrate

        return calibrate.main(ns)
    if ns.command == "simulate":
        from sluice.runtime.sim import simulate

        return simulate.main(ns)
    if ns.command == "plan":
        from sluice.runtime.sim.plan import command as plan

        return plan.main(ns)
    raise ValueError(f"unknown command {ns.command}")
