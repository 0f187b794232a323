"""Who gets the CPU cores: the model worker, not the processes around it.

The scheduler process runs the model with torch's intra-op pool over every core (or
`--torch-threads`). The API server (tokenizer) and the detokenizer only tokenize, detokenize
and move messages; a second thread pool in either (torch's, or the tokenizers library's
Rayon pool) would only wake up to compete with the model's threads, and one preempted model
thread stalls the whole parallel region. So both keep to one thread.

The model worker's thread count is the cores it may run on, capped by its cgroup's CPU quota
(a Kubernetes CPU limit): a pool wider than the quota gets throttled mid-region, and one
throttled thread stalls every parallel region it is part of.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def limit_helper_process_threads() -> None:
    """Call at the start of a process that serves the model worker but does not run it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "torch" in sys.modules:  # never import torch just to configure it
        import torch

        torch.set_num_threads(1)


def cgroup_cpu_limit(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 `cpu.max` text; None when unlimited or unreadable."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def model_worker_threads(requested: int = 0, default: int | None = None) -> tuple[int, str]:
    """Intra-op threads for the model worker and why: `--torch-threads` if set, else
    `default` (torch's own choice, one per physical core) or the cores in this process's
    affinity mask, capped by the cgroup CPU quota (rounded up)."""
    if requested > 0:
        return requested, "--torch-threads"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    chosen, why = (min(default, cores), "torch's default") if default else (cores, "")
    why = why or f"{cores} cores in the affinity mask"
    try:
        limit = cgroup_cpu_limit(CGROUP_CPU_MAX.read_text())
    except OSError:
        limit = None
    if limit is not None and math.ceil(limit) < chosen:
        return max(1, math.ceil(limit)), f"cgroup CPU quota {limit:g} of {cores} cores"
    return chosen, why
