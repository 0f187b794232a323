"""The operator Deployment's environment is what `sluice.operator.settings.Settings`
reads: the chart's values turn into the operator's settings (read back with the
operator's own `Settings.from_env`), and only into variables it knows."""

from __future__ import annotations

import dataclasses

from chart_testkit import ALL_ON, DEFAULTS, NAMESPACED_ALL_ON, operator_container, plain_env
from chart_testkit import render_objects as render

from sluice.operator.settings import Settings


def settings_for(values) -> Settings:
    return Settings.from_env(plain_env(operator_container(render(values))))


def test_every_sluice_variable_the_chart_sets_is_an_operator_setting():
    known = {"SLUICE_" + f.name.upper() for f in dataclasses.fields(Settings)}
    for values in (DEFAULTS, ALL_ON, NAMESPACED_ALL_ON):
        env = plain_env(operator_container(render(values)))
        assert {name for name in env if name.startswith("SLUICE_")} <= known


def test_default_values_give_a_single_cluster_wide_operator():
    settings = settings_for(DEFAULTS)
    assert settings == Settings(
        default_image="sluice-runtime:0.1.0",
        router_image="sluice-router:0.1.0",
        liveness_endpoint="http://0.0.0.0:8080/healthz",
    )
    assert settings.clusterwide and not settings.leader_election


def test_values_map_onto_the_operator_settings():
    values = {
        "operator": {
            "watchNamespaces": ["team-a", "team-b"],
            "logFormat": "json",
            "verbose": True,
            "clusterDomain": "corp.example",
            "podMonitors": "never",
            "retryDelaySeconds": 2.5,
            "retryMaxDelaySeconds": 120,
            "resyncSeconds": 60,
            "schedulingGraceSeconds": 120,
            "workers": 8,
            "apiTimeoutSeconds": 45,
            "healthPort": 9090,
            "replicas": 2,
            "leaderElection": {"enabled": True, "leaseName": "sluice-ha", "retryPeriodSeconds": 1},
        },
        "runtime": {
            "image": {"repository": "ghcr.io/acme/sluice-runtime", "tag": "0.1.0-cpu"},
            "runAsUser": None,
            "rollOnUpgrade": True,
        },
        "router": {"image": {"repository": "ghcr.io/acme/sluice-router", "digest": "sha256:" + "a" * 64}},
    }
    assert settings_for(values) == Settings(
        default_image="ghcr.io/acme/sluice-runtime:0.1.0-cpu",
        router_image="ghcr.io/acme/sluice-router@sha256:" + "a" * 64,
        namespaces=("team-a", "team-b"),
        log_format="json",
        verbose=True,
        cluster_domain="corp.example",
        pod_monitors="never",
        leader_election=True,
        lease_name="sluice-ha",
        lease_namespace="sluice-system",
        retry_period_seconds=1.0,
        retry_delay_seconds=2.5,
        retry_max_delay_seconds=120.0,
        resync_seconds=60.0,
        scheduling_grace_seconds=120.0,
        workers=8,
        api_timeout_seconds=45.0,
        liveness_endpoint="http://0.0.0.0:9090/healthz",
        run_as_user=None,
        roll_on_upgrade=True,
    )


def test_each_elected_replica_is_named_by_its_pod_and_the_lease_by_the_release():
    settings = settings_for(ALL_ON)
    assert (settings.lease_name, settings.lease_namespace) == ("sluice", "sluice-system")
    [identity] = [
        e for e in operator_container(render(ALL_ON))["env"] if e["name"] == "SLUICE_IDENTITY"
    ]
    assert identity["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_charts_podmonitor_turns_the_operators_off():
    assert settings_for({"monitoring": {"enabled": True}}).pod_monitors == "never"
    off = {"monitoring": {"enabled": True, "podMonitor": {"enabled": False}}}
    assert settings_for(off).pod_monitors == "auto"


def test_liveness_endpoint_is_the_port_the_probes_use():
    container = operator_container(render({"operator": {"healthPort": 9090}}))
    assert container["ports"][0]["containerPort"] == 9090
    assert Settings.from_env(plain_env(container)).liveness_endpoint.endswith(":9090/healthz")


def test_the_operator_runs_the_module_entrypoint():
    assert operator_container(render(DEFAULTS))["command"] == ["python", "-m", "sluice.operator"]


def test_without_the_optional_rules_the_operator_has_no_access_to_those_kinds():
    settings = settings_for({"rbac": {"podMonitors": False, "inferencePools": False}})
    assert (settings.pod_monitors, settings.inference_pools) == ("off", "off")
    assert (settings_for(DEFAULTS).pod_monitors, settings_for(DEFAULTS).inference_pools) == (
        "auto",
        "auto",
    )
