"""The real-control-plane tier: one local Kubernetes control plane for the whole session
(etcd, kube-apiserver, controller manager, scheduler, kwok's fake nodes, a metrics API
server; all on 127.0.0.1), the chart installed with Helm's own code, and the operator run
as its own process under the chart's ServiceAccount.

The binaries are built by `scripts/build_control_plane.sh` (`make cluster-bin`; `make test`
runs it first). A failed build fails this tier; only a machine without Go skips it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

# scripts/local_cluster.py (the control plane; `make cluster` runs it too), for every module here
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import local_cluster  # noqa: E402
from cluster_kit import (  # noqa: E402
    CHART_DIR,
    OPERATOR_NS,
    RELEASE,
    SCHEDULING_GRACE_S,
    Kube,
    OperatorProcess,
    operator_process,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.integration)


def _ensure_binaries() -> Path:
    build = subprocess.run(
        [str(local_cluster.BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PY": sys.executable},
    )
    lines = [line for line in build.stderr.splitlines() if line.strip()]
    if build.returncode == 3:
        pytest.skip(lines[-1] if lines else "no Go toolchain: the control plane cannot be built")
    if build.returncode != 0:
        pytest.fail(lines[-1] if lines else f"control plane build failed ({build.returncode})",
                    pytrace=False)  # fmt: skip
    return local_cluster.bin_dir()


def _processes_naming(workdir: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if str(workdir) in cmdline:
            found.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return found


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_cluster.ControlPlane]:
    binaries = _ensure_binaries()
    workdir = tmp_path_factory.mktemp("cluster")
    plane = local_cluster.ControlPlane(workdir, binaries)
    try:
        plane.start()
    except local_cluster.ControlPlaneError as error:
        pytest.fail(f"the local control plane did not start: {error}", pytrace=False)
    yield plane
    plane.stop()
    left = _processes_naming(workdir)
    assert not left, "control plane processes outlived the session:\n" + "\n".join(left)


@pytest.fixture(scope="session")
def kube(control_plane: local_cluster.ControlPlane) -> Kube:
    return Kube(control_plane)


@pytest.fixture(scope="session")
def chart_release(kube: Kube) -> dict[str, Any]:
    """`helm install sluice charts/sluice -n sluice-system --create-namespace` with Helm's own
    code (helm-python-sdk), into the empty cluster: CRDs, RBAC, the operator's Deployment."""
    import helm_python as helm

    config = helm.Config(kubeconfig_path=kube.plane.kubeconfig, namespace=OPERATOR_NS)
    chart = helm.Chart.load(CHART_DIR)
    release = config.install(chart, RELEASE, {}, namespace=OPERATOR_NS, create_namespace=True,
                             timeout=120)  # fmt: skip
    return dict(release)


@pytest.fixture(scope="session")
def operator(
    kube: Kube, chart_release: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    # a short scheduling grace: the GPU test sees an unschedulable pod wait for capacity
    # (Progressing), then turn Degraded, within its deadlines
    process = operator_process(
        kube, tmp_path_factory.mktemp("operator") / "operator.log",
        extra_env={"SLUICE_SCHEDULING_GRACE_SECONDS": str(SCHEDULING_GRACE_S)},
    )  # fmt: skip
    process.start()
    yield process
    process.stop()
    # the chart's RBAC was enough for everything the tier made the operator do
    denied = [line for line in process.errors() if "403" in line or "orbidden" in line]
    assert not denied, "the operator was refused by RBAC:\n" + "\n".join(denied[:20])


@pytest.fixture
def ns(request: pytest.FixtureRequest, kube: Kube) -> Iterator[str]:
    """A fresh namespace named after the test, deleted after it (its fake pods would hold
    node capacity the next tests schedule into)."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.removeprefix("test_").lower())
    yield kube.create_namespace(name[:60].strip("-"))
    kube.kubectl("delete", "namespace", name[:60].strip("-"), "--wait=false")
