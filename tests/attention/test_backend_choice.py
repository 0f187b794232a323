"""Which attention backend `auto` picks per device, and how an impossible choice is refused."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from sluice.runtime.attention import registry
from sluice.runtime.attention.availability import backend_problem
from sluice.runtime.attention.cpu_backend import CpuAttentionBackend
from sluice.runtime.attention.registry import create_attention_backend, resolve_backend_name


@pytest.mark.parametrize(
    "importable, device, expected",
    [
        ({"flashinfer", "triton"}, "cuda", "flashinfer"),
        ({"flashinfer", "triton"}, "cuda:0", "flashinfer"),
        ({"triton"}, "cuda", "triton"),
        (set(), "cuda", "torch"),
        ({"flashinfer", "triton"}, "cpu", "cpu"),  # the compiled paged kernels (or their fallback)
    ],
)
def test_auto_picks_by_device_and_what_imports(monkeypatch, importable, device, expected):
    monkeypatch.setattr(registry, "_imports", lambda module: module in importable)
    assert resolve_backend_name("auto", device) == expected


def test_explicit_names_are_kept_and_unknown_ones_refused():
    assert resolve_backend_name("torch", "cuda") == "torch"
    assert resolve_backend_name("triton", "cpu") == "triton"
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        resolve_backend_name("xformers", "cpu")


def test_the_choice_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="sluice.attention"):
        backend = create_attention_backend("auto", "cpu")
    assert isinstance(backend, CpuAttentionBackend)
    assert "attention backend: cpu (auto on cpu)" in caplog.text


def test_flashinfer_on_the_cpu_is_refused_in_one_line():
    problem = backend_problem("flashinfer", "cpu")
    assert problem is not None and "needs a CUDA GPU" in problem and "\n" not in problem
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        create_attention_backend("flashinfer", "cpu")


def test_triton_on_the_cpu_needs_the_interpreter():
    pytest.importorskip("triton")
    assert "TRITON_INTERPRET=1" in backend_problem("triton", "cpu", interpreter=False)
    assert backend_problem("triton", "cpu", interpreter=True) is None
    assert backend_problem("triton", "cuda", interpreter=False) is None


def test_a_missing_package_is_named(monkeypatch):
    from sluice.runtime.attention import availability

    monkeypatch.setattr(availability, "_installed", lambda module: False)
    problem = backend_problem("flashinfer", "cuda")
    assert problem is not None and "pip install flashinfer-python" in problem


def _serve(*flags: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.runtime", "serve", *flags],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_serve_flashinfer_on_cpu_exits_2_with_one_clear_line():
    proc = _serve("--device", "cpu", "--attention-backend", "flashinfer", env=dict(os.environ))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "sluice serve: --attention-backend flashinfer needs a CUDA GPU, but the device is cpu; "
        "use torch (or triton under TRITON_INTERPRET=1, for tests)"
    ]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_serve_triton_on_cpu_without_the_interpreter_exits_2():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = _serve("--device", "cpu", "--attention-backend", "triton", env=env)
    assert proc.returncode == 2
    assert "TRITON_INTERPRET=1" in proc.stderr and "Traceback" not in proc.stderr
