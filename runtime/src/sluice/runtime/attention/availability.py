"""Whether an attention backend can run on a device, without importing torch or the
backend's package (the command line checks this while parsing flags)."""

from __future__ import annotations

import importlib.util
import os

from sluice.runtime import constants

# the package each backend needs, as pip names it
_PACKAGES = {"triton": ("triton", "triton"), "flashinfer": ("flashinfer", "flashinfer-python")}


def is_cuda(device: object) -> bool:
    return str(device).startswith("cuda")


def triton_interpreter_on() -> bool:
    """Whether Triton's interpreter is on (Triton's own variable, read at `@triton.jit`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def backend_problem(name: str, device: object, *, interpreter: bool | None = None) -> str | None:
    """Why backend `name` cannot run on `device`, in one line; None when it can.

    Only looks the packages up (no import), so the command line can check it cheaply.
    `interpreter` defaults to whether `TRITON_INTERPRET` is set."""
    if name in ("auto", "torch"):
        return None
    flag = f"{constants.FLAG_ATTENTION_BACKEND} {name}"
    if name == "cpu":
        if str(device).startswith("cpu"):
            return None
        return f"{flag} runs on the CPU only, but the device is {device}"
    if name == "flashinfer" and not is_cuda(device):
        return (
            f"{flag} needs a CUDA GPU, but the device is {device}; "
            "use torch (or triton under TRITON_INTERPRET=1, for tests)"
        )
    module, package = _PACKAGES[name]
    if not _installed(module):
        return f"{flag} needs the {package} package, which is not installed (pip install {package})"
    if name == "triton" and not is_cuda(device):
        on = triton_interpreter_on() if interpreter is None else interpreter
        if not on:
            return (
                f"{flag} on the CPU runs only under Triton's interpreter: set "
                "TRITON_INTERPRET=1 (slow, meant for tests), or use torch"
            )
    return None
