"""The small pieces around the handlers: API paths and errors, login, RBAC table, CLI."""

from __future__ import annotations

import kopf
import pytest

from sluice.operator import rbac
from sluice.operator.__main__ import main
from sluice.operator.auth import has_credentials
from sluice.operator.kube import (
    DEPLOYMENTS,
    INFERENCESERVICES,
    SERVICES,
    ApiError,
    _error_from,
    resource_of,
)

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


def test_resource_paths_follow_the_api_layout():
    assert SERVICES.path("ml", "chat") == "/api/v1/namespaces/ml/services/chat"
    assert DEPLOYMENTS.path("ml") == "/apis/apps/v1/namespaces/ml/deployments"
    assert (
        INFERENCESERVICES.path("ml", "chat", "status")
        == "/apis/sluice.dev/v1alpha1/namespaces/ml/inferenceservices/chat/status"
    )


def test_objects_map_to_their_resource():
    assert resource_of({"apiVersion": "apps/v1", "kind": "Deployment"}) is DEPLOYMENTS
    with pytest.raises(ValueError):
        resource_of({"apiVersion": "batch/v1", "kind": "Job"})


def test_api_errors_carry_the_status_reason_and_message():
    error = _error_from(422, '{"kind": "Status", "reason": "Invalid", "message": "spec.x: bad"}')
    assert (error.status, error.reason, error.message) == (422, "Invalid", "spec.x: bad")
    assert _error_from(502, "<html>bad gateway</html>").message == "<html>bad gateway</html>"


@pytest.mark.parametrize("status", [0, 401, 404, 409, 429, 500, 503])
def test_api_errors_time_may_fix_are_transient(status):
    assert ApiError(status, "X", "y").transient  # retried with back-off


@pytest.mark.parametrize("status", [400, 422])
def test_rejections_are_not_transient(status):
    assert not ApiError(status, "Invalid", "spec.template: bad").transient  # reported, resynced


def test_credentials_are_recognised():
    assert has_credentials(kopf.ConnectionInfo(server="https://k", token="t"))
    assert has_credentials(kopf.ConnectionInfo(server="https://k", certificate_data="Y2VydA=="))
    assert not has_credentials(kopf.ConnectionInfo(server="https://k"))  # e.g. an exec plugin


def test_rbac_table_is_well_formed():
    seen = set()
    for p in rbac.REQUIRED_PERMISSIONS:
        assert set(p.verbs) <= VERBS, p
        assert p.scope in ("workload", "cluster", "operator"), p
        assert p.when in (
            "always", "leaderelection", "namespaces", "podmonitors", "inferencepools"
        ), p
        assert p.why, p
        assert (p.api_group, p.resource) not in seen, p
        seen.add((p.api_group, p.resource))


def test_rbac_grants_nothing_the_operator_does_not_use():
    assert not rbac.allows("apps", "deployments", "update")  # server-side apply patches
    assert not rbac.allows("rbac.authorization.k8s.io", "roles", "bind")  # held, not bound
    assert not rbac.allows("rbac.authorization.k8s.io", "clusterroles", "create")
    assert not rbac.allows("discovery.k8s.io", "endpointslices", "create")  # read, for the router
    assert not rbac.allows("", "secrets", "list")  # only the Secret a spec names is read
    assert not rbac.allows("", "secrets", "watch")
    assert not rbac.allows("monitoring.coreos.com", "podmonitors", "create")  # only when installed
    assert rbac.allows(
        "monitoring.coreos.com", "podmonitors", "create", when=frozenset({"podmonitors"})
    )
    assert not rbac.allows("inference.networking.k8s.io", "inferencepools", "create")
    assert rbac.allows(
        "inference.networking.k8s.io", "inferencepools", "create",
        when=frozenset({"inferencepools"}),
    )  # fmt: skip


def test_module_entry_point_has_help(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "--default-image" in capsys.readouterr().out
