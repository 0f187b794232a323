"""Fixtures for the operator tests (helpers live in operator_testkit.py and kopf_testkit.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_hub import FakeHub
from kopf.testing import KopfRunner
from kopf_testkit import ISVC, RESYNC_S, ErrorLog, environment, watching
from operator_cluster import Cluster, wait_for
from operator_testkit import IMAGE, isvc_object, load_crd
from operator_validators import CrdValidator

from sluice.operator.parsing import parse_spec
from sluice.operator.spec import InferenceServiceSpec


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return load_crd()


@pytest.fixture(scope="session")
def crd_validator(crd: dict[str, Any]) -> CrdValidator:
    return CrdValidator(crd)


@pytest.fixture
def make_spec() -> Callable[..., InferenceServiceSpec]:
    def make(name: str = "chat", namespace: str = "default", **spec: Any) -> InferenceServiceSpec:
        obj = isvc_object(name, namespace, **spec)
        return parse_spec(name, namespace, obj["spec"], default_image=IMAGE)

    return make


# --- the emulated cluster and one operator per test module (tests that take `ns`) ---------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    emulated = Cluster()
    yield emulated
    emulated.close()


@pytest.fixture(scope="module")
def errors() -> Iterator[ErrorLog]:
    log = ErrorLog()
    log.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger().addHandler(log)
    yield log
    logging.getLogger().removeHandler(log)
    assert not log.records, "the operator logged errors:\n" + "\n".join(t for _, t in log.records)


@pytest.fixture(scope="session")
def hub() -> Iterator[FakeHub]:
    """The Hub API the operator pins hf:// revisions with (SLUICE_HF_ENDPOINT)."""
    fake = FakeHub()
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def operator(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    errors: ErrorLog,
    hub: FakeHub,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KopfRunner]:
    """The operator, with the test module's OPERATOR_ENV (if any) over the defaults."""
    kubeconfig = cluster.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    env = {
        "KUBECONFIG": str(kubeconfig),
        "SLUICE_HF_ENDPOINT": hub.url,
        "SLUICE_DEFAULT_IMAGE": IMAGE,
        "SLUICE_RETRY_DELAY_SECONDS": "0.2",
        "SLUICE_RETRY_MAX_DELAY_SECONDS": "1",
        "SLUICE_RESYNC_SECONDS": str(RESYNC_S),
        **getattr(request.module, "OPERATOR_ENV", {}),
    }
    with (
        environment(**env),
        KopfRunner(["run", "--standalone", "-A", "--verbose", "-m", "sluice.operator"]) as runner,
    ):
        for plural in ("inferenceservices", "deployments", "pods", "horizontalpodautoscalers"):
            wait_for(lambda p=plural: watching(cluster, p), what=f"the operator to watch {plural}")
        yield runner
    assert runner.exception is None
    assert runner.exit_code == 0


@pytest.fixture
def ns(
    request: pytest.FixtureRequest, cluster: Cluster, errors: ErrorLog, operator: KopfRunner
) -> Iterator[str]:
    """The test's namespace; an operator error naming it (or nothing) fails the test."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.removeprefix("test_").lower())
    name = name[:60].strip("-")
    seen = len(errors.records)
    yield name
    for item in cluster.list(*ISVC, name):  # stop resyncing what the test left
        cluster.delete(*ISVC, name, item["metadata"]["name"])
    mine = [text for namespace, text in errors.records[seen:] if namespace in (name, None)]
    for record in [r for r in errors.records[seen:] if r[0] in (name, None)]:
        errors.records.remove(record)
    assert not mine, "the operator logged errors during this test:\n" + "\n".join(mine)
