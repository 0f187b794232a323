"""scripts/gpu_check.sh's logic, on a machine without a GPU: its plan fits one device call
(speed before correctness, caps summed under the budget, the budget under 8 minutes), and
without CUDA it stops at once with one line and a non-zero status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
ONE_COMMAND_S = 600  # the device tool's limit for one command
RERUN_ROOM_S = 8 * 60  # the check must leave room for a rerun in a 15-minute lease


def _plan() -> tuple[list[tuple[str, int]], int, int]:
    done = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    steps, caps, budget = [], 0, 0
    for line in done.stdout.splitlines():
        words = line.split()
        if words[0] == "step":
            steps.append((words[1], int(words[3])))
        elif words[0] == "caps":
            caps, budget = int(words[1]), int(words[3])
    return steps, caps, budget


def test_the_steps_caps_add_up_under_the_budget_and_the_budget_under_eight_minutes():
    steps, caps, budget = _plan()
    assert caps == sum(cap for _, cap in steps)
    assert caps <= budget < RERUN_ROOM_S < ONE_COMMAND_S


def test_serving_and_speed_run_before_correctness():
    names = [name for name, _ in _plan()[0]]
    assert names.index("roofline") < names.index("correctness")
    assert names.index("serving") < names.index("correctness")


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(torch.cuda.is_available())"]).returncode,
    reason="this machine has CUDA",
)
def test_without_cuda_it_fails_at_once_with_one_line(tmp_path):
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 3
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA" in lines[0] and "FAIL" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
