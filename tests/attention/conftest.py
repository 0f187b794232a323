"""Triton kernels run under Triton's interpreter on the CPU: the variable must be set
before any kernel module is imported (Triton decides at `@triton.jit` time)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
