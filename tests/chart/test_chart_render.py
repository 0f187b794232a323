"""What the chart renders: the objects for the default values and for every optional
feature, each valid against the Kubernetes 1.30 schemas (strict: no unknown fields), the
monitoring switches, and the operator Deployment's shape."""

from __future__ import annotations

import helm_python as helm
import pytest
from chart_testkit import (
    ALL_ON,
    DEFAULTS,
    NAMESPACE,
    NAMESPACED_ALL_ON,
    crd_objects,
    find,
    notes,
    one,
    operator_container,
    render,
    render_objects,
    validate,
)

from sluice.operator import constants as oc
from sluice.runtime import constants as rc

VALUE_SETS = {"defaults": DEFAULTS, "all-features": ALL_ON, "namespaced": NAMESPACED_ALL_ON}


def kinds(objects):
    return sorted(o["kind"] for o in objects)


def test_defaults_render_the_operator_and_its_rbac_only():
    assert kinds(render_objects(DEFAULTS)) == [
        "ClusterRole", "ClusterRole", "ClusterRole",  # the operator's; view and edit aggregation
        "ClusterRoleBinding", "Deployment", "ServiceAccount",
    ]  # fmt: skip


def test_every_optional_feature_renders():
    assert kinds(render_objects(ALL_ON)) == [
        "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
        "Deployment", "PodMonitor", "PrometheusRule", "Role", "RoleBinding", "ServiceAccount",
    ]  # fmt: skip
    namespaced = render_objects(NAMESPACED_ALL_ON)
    # the Lease's Role lives in the release namespace, whatever namespaces are watched
    assert {o["metadata"]["namespace"] for o in find(namespaced, "Role")} == {
        "team-a", "team-b", "sluice-system",
    }  # fmt: skip


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_is_valid_for_kubernetes_1_30(name):
    objects = render_objects(VALUE_SETS[name])
    for obj in objects:
        validate(obj)
    namespaced = [o for o in objects if not o["kind"].startswith("Cluster")]
    assert all(o["metadata"].get("namespace") for o in namespaced)


def test_the_crds_the_chart_installs_are_valid_for_kubernetes_1_30():
    crds = crd_objects()
    assert sorted(c["metadata"]["name"] for c in crds) == ["inferenceservices.sluice.dev"]
    for crd in crds:
        validate(crd)


def test_validation_catches_a_bad_object():
    """The validators used above are not vacuous: one wrong field fails each kind."""
    objects = render_objects(ALL_ON)
    for kind in ("Deployment", "ClusterRole", "PodMonitor", "PrometheusRule", "Role"):
        broken = dict(find(objects, kind)[0])
        broken["spec" if "spec" in broken else "metadata"] = {
            **broken.get("spec", broken["metadata"]),
            "unknownField": 1,
        }
        with pytest.raises(Exception, match="unknownField|Additional properties"):
            validate(broken)


MONITORING_KINDS = {"podMonitor": "PodMonitor", "prometheusRule": "PrometheusRule",
                    "grafanaDashboard": "ConfigMap"}  # fmt: skip


def monitoring_kinds(values):
    return {o["kind"] for o in render_objects(values)} & set(MONITORING_KINDS.values())


def test_monitoring_enabled_turns_every_extra_on_at_once():
    assert monitoring_kinds({"monitoring": {"enabled": True}}) == set(MONITORING_KINDS.values())
    assert monitoring_kinds(DEFAULTS) == set()


@pytest.mark.parametrize("switch", MONITORING_KINDS)
def test_each_monitoring_extra_has_its_own_switch(switch):
    off = {"monitoring": {"enabled": True, switch: {"enabled": False}}}
    assert monitoring_kinds(off) == set(MONITORING_KINDS.values()) - {MONITORING_KINDS[switch]}
    alone = {"monitoring": {"enabled": False, switch: {"enabled": True}}}
    assert monitoring_kinds(alone) == set()  # the master switch gates them all


def test_podmonitor_scrapes_the_runtime_pods_metrics_port():
    monitor = one(render_objects(ALL_ON), "PodMonitor")
    assert monitor["spec"]["selector"] == {"matchLabels": {oc.LABEL_NAME: oc.APP_NAME}}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (rc.CONTAINER_PORT_NAME, rc.METRICS_PATH)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    namespaced = one(render_objects(NAMESPACED_ALL_ON), "PodMonitor")
    assert namespaced["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_grafana_dashboard_configmap_carries_the_sidecar_label_whatever_the_user_sets():
    values = {"monitoring": {"enabled": True, "grafanaDashboard": {
        "namespace": "monitoring", "labels": {"grafana_dashboard": "0", "team": "ml"}}}}  # fmt: skip
    config_map = one(render_objects(values), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["labels"]["team"] == "ml"
    assert config_map["metadata"]["namespace"] == "monitoring"


def test_operator_pod_is_restricted_and_probed():
    objects = render_objects(DEFAULTS)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"}]
    assert container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_a_single_operator_is_recreated_and_elected_replicas_roll():
    assert one(render_objects(DEFAULTS), "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    elected = one(render_objects(ALL_ON), "Deployment")["spec"]
    assert elected["replicas"] == 2 and elected["strategy"]["type"] == "RollingUpdate"


def test_more_than_one_replica_without_leader_election_is_refused():
    with pytest.raises(helm.HelmError, match="/operator/leaderElection/enabled"):
        render({"operator": {"replicas": 2}})


def test_extra_env_cannot_override_a_setting_the_chart_owns():
    with pytest.raises(helm.HelmError, match="SLUICE_NAMESPACES is set by the chart"):
        render({"operator": {"extraEnv": [{"name": "SLUICE_NAMESPACES", "value": "x"}]}})


def test_existing_service_account_is_used_when_the_chart_creates_none():
    objects = render_objects({"serviceAccount": {"create": False, "name": "my-sa"}})
    assert not find(objects, "ServiceAccount")
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "my-sa"
    assert one(objects, "ClusterRoleBinding")["subjects"][0]["name"] == "my-sa"
    with pytest.raises(helm.HelmError, match="serviceAccount.name is required"):
        render({"serviceAccount": {"create": False}})


def test_image_references_follow_tag_digest_and_app_version():
    objects = render_objects(DEFAULTS)
    assert operator_container(objects)["image"] == "sluice-operator:0.1.0"
    digest = "sha256:" + "a" * 64
    values = {
        "operator": {"image": {"repository": "ghcr.io/acme/sluice-operator", "digest": digest}}
    }
    assert (
        operator_container(render_objects(values))["image"]
        == f"ghcr.io/acme/sluice-operator@{digest}"
    )


def test_notes_tell_the_user_what_to_apply_next():
    text = notes(DEFAULTS)
    assert "kubectl apply -f samples/smollm2-cpu.yaml" in text
    assert f"kubectl -n {NAMESPACE} rollout status deployment/sluice-operator" in text
    assert "prometheus-adapter-values.yaml" in text
    assert "PodMonitor" in notes(ALL_ON) and "PodMonitor" not in text
