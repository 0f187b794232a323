"""Which `sluice serve` flags the simulator's commands take, and the `ServerArgs` they make.

Scheduling flags change the scheduler's decisions and are simulated exactly. Cost flags
(`calibration.COST_FLAGS`: dtype, quantization, attention backend, threads, ...) change
what a step costs: a calibration is measured with one value of each, `sluice calibrate`
takes them, and `sluice simulate` refuses a value that differs from its calibration's.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from sluice.runtime.dataclass_cli import add_flags
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.sim.calibration import COST_FLAGS

SCHEDULING_FLAGS = (
    "page_size", "max_total_tokens", "cpu_kv_cache_gib", "max_running_requests",
    "max_prefill_tokens", "chunked_prefill_size", "max_context_len", "schedule_policy",
    "retraction_policy", "init_new_token_ratio", "schedule_conservativeness",
    "disable_radix_cache", "in_batch_prefix_check_threshold",
    "in_batch_prefix_deprioritize_threshold", "disable_mixed_chunk", "max_prefill_streak",
    "disable_overlap_schedule", "enable_overlap_schedule", "random_seed",
)  # fmt: skip
MODEL_FLAGS = ("model", "model_cache_dir")


def add_server_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    group = parser.add_argument_group("sluice serve flags")
    add_flags(group, ServerArgs, only=names)  # type: ignore[arg-type]


def server_args_from(ns: argparse.Namespace, names: tuple[str, ...], **fixed: Any) -> ServerArgs:
    """`ServerArgs` with the parsed flags in `names` (others at their defaults), validated."""
    values = {n: getattr(ns, n) for n in names if hasattr(ns, n)}
    args = dataclasses.replace(ServerArgs(), **{**values, **fixed})
    args.validate()
    return args


def cost_flag_values(args: ServerArgs) -> dict[str, Any]:
    return {name: getattr(args, name) for name in COST_FLAGS}
