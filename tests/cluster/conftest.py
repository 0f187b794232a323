"""The real-control-plane tier: one local Kubernetes control plane for the whole session
(etcd, kube-apiserver, controller manager, scheduler, kwok's fake nodes, a metrics API
server; all on 127.0.0.1), the chart installed with Helm's own code, and the operator run
as its own process under the chart's ServiceAccount.

The binaries are built by `scripts/build_control_plane.sh` (`make cluster-bin`; `make test`
runs it first). A failed build fails this tier; a machine without Go skips it, with one line
saying so, except under CI=true, where that fails it too (`build_verdict`).

This tier runs last in a session that collects other tests too, so its control plane and
operator (~0.8 GB, session fixtures) are stopped right after its last test instead of living
through the rest of `make test` (`pytest_collection_modifyitems`). Every process they start
is SIGKILLed by the kernel if the test run itself is killed (PR_SET_PDEATHSIG).
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
from fake_hub import FakeHub

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
    build_verdict,
    operator_process,
)

HERE = Path(__file__).parent


@pytest.hookimpl(trylast=True)  # after any other plugin's reordering
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this tier's tests, and move them after every other test, keeping the order within
    each part: pytest finalizes session fixtures when the session's last test is done, so
    with this tier last, its control plane and operator stop as soon as its last test has
    run, whatever else the run collected."""
    ours = [item for item in items if HERE in Path(str(item.fspath)).parents]
    for item in ours:
        item.add_marker(pytest.mark.cluster)
        item.add_marker(pytest.mark.integration)
    if ours:
        chosen = set(map(id, ours))
        items[:] = [item for item in items if id(item) not in chosen] + ours


_TIER_SKIP: list[str] = []  # why the whole tier is skipped (no Go), once decided


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A skip of the whole tier is reported at one place (here), not at each test's, so that
    `-ra` folds the tier's ~90 skips into one line."""
    report = yield
    if (
        _TIER_SKIP
        and report.skipped
        and isinstance(report.longrepr, tuple)
        and _TIER_SKIP[0] in str(report.longrepr[2])
    ):
        report.longrepr = (__file__, _ensure_binaries.__code__.co_firstlineno, report.longrepr[2])
    return report


def _ensure_binaries() -> Path:
    build = subprocess.run(
        [str(local_cluster.BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PY": sys.executable},
    )
    verdict, why = build_verdict(build.returncode, build.stderr, os.environ)
    if verdict == "skip":
        _TIER_SKIP.append(why)
        pytest.skip(why)
    if verdict == "fail":
        pytest.fail(why, pytrace=False)
    return local_cluster.bin_dir()


def _processes_naming(workdir: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if str(workdir) in cmdline:
            found.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return found


@pytest.fixture(scope="session")
def binaries() -> Path:
    """The control plane's binaries (built when missing); skips or fails the tier as
    `build_verdict` says."""
    return _ensure_binaries()


@pytest.fixture(scope="session")
def control_plane(
    binaries: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[local_cluster.ControlPlane]:
    workdir = tmp_path_factory.mktemp("cluster")
    plane = local_cluster.ControlPlane(workdir, binaries, die_with_parent=True)
    try:
        plane.start()  # stops what it started when it fails
    except local_cluster.ControlPlaneError as error:
        pytest.fail(f"the local control plane did not start: {error}", pytrace=False)
    try:
        yield plane
    finally:
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
def hub() -> Iterator[FakeHub]:
    """The Hub API the operator pins hf:// revisions with (nothing leaves this machine)."""
    fake = FakeHub()
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def operator(
    kube: Kube,
    chart_release: dict[str, Any],
    hub: FakeHub,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    # a short scheduling grace: the GPU test sees an unschedulable pod wait for capacity
    # (Progressing), then turn Degraded, within its deadlines
    process = operator_process(
        kube, tmp_path_factory.mktemp("operator") / "operator.log",
        extra_env={"SLUICE_SCHEDULING_GRACE_SECONDS": str(SCHEDULING_GRACE_S),
                   "SLUICE_HF_ENDPOINT": hub.url},
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
