"""The operator Deployment's environment is what `sluice.operator.settings.Settings`
reads: the chart's values turn into the operator's settings (read back with the
operator's own `Settings.from_env`), and only into variables it knows."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

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


def test_default_values_give_a_standalone_cluster_wide_operator():
    settings = settings_for(DEFAULTS)
    assert settings == Settings(
        default_image="sluice-runtime:0.1.0",
        liveness_endpoint="http://0.0.0.0:8080/healthz",
    )
    assert settings.clusterwide and settings.standalone


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
            "peering": {"enabled": True, "name": "sluice-ha"},
        },
        "runtime": {
            "image": {"repository": "ghcr.io/acme/sluice-runtime", "tag": "0.1.0-cpu"},
            "runAsUser": None,
            "rollOnUpgrade": True,
        },
    }
    assert settings_for(values) == Settings(
        default_image="ghcr.io/acme/sluice-runtime:0.1.0-cpu",
        namespaces=("team-a", "team-b"),
        log_format="json",
        verbose=True,
        cluster_domain="corp.example",
        pod_monitors="never",
        peering="sluice-ha",
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


def test_peering_name_defaults_to_the_release_and_matches_the_peering_object():
    objects = render(ALL_ON)
    [peering] = [o for o in objects if o["kind"] == "ClusterKopfPeering"]
    assert settings_for(ALL_ON).peering == peering["metadata"]["name"] == "sluice"


def test_the_charts_podmonitor_turns_the_operators_off():
    assert settings_for({"monitoring": {"enabled": True}}).pod_monitors == "never"
    off = {"monitoring": {"enabled": True, "podMonitor": {"enabled": False}}}
    assert settings_for(off).pod_monitors == "auto"


def test_liveness_endpoint_is_the_port_the_probes_use():
    container = operator_container(render({"operator": {"healthPort": 9090}}))
    assert container["ports"][0]["containerPort"] == 9090
    assert Settings.from_env(plain_env(container)).liveness_endpoint.endswith(":9090/healthz")


def test_standalone_operator_runs_the_module_entrypoint():
    assert operator_container(render(DEFAULTS))["command"] == ["python", "-m", "sluice.operator"]


def test_peered_replicas_get_a_distinct_priority_from_their_pod_ip(tmp_path):
    """Run the container's shell command with a stand-in `python -m sluice.operator` that
    prints the SLUICE_PRIORITY it would start with."""
    container = operator_container(render(ALL_ON))
    assert container["command"] == ["/bin/sh", "-c"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        container["env"]
    )
    shim = tmp_path / "python"
    shim.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            if [ "$1 $2" = "-m sluice.operator" ]; then
                echo "$SLUICE_PRIORITY"; exit 0
            fi
            exec {sys.executable} "$@"
            """
        )
    )
    shim.chmod(0o755)

    def priority(pod_ip: str) -> int:
        env = {**plain_env(container), "POD_IP": pod_ip}
        env["PATH"] = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
        done = subprocess.run(
            [*container["command"], *container["args"]],
            env=env, capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        return Settings.from_env({"SLUICE_PRIORITY": done.stdout}).priority

    priorities = {priority(ip) for ip in ("10.244.1.17", "10.244.2.17", "fd00::1:17")}
    assert len(priorities) == 3 and all(0 <= p < 2**31 for p in priorities)


def test_without_the_optional_rules_the_operator_has_no_access_to_those_kinds():
    settings = settings_for({"rbac": {"podMonitors": False, "inferencePools": False}})
    assert (settings.pod_monitors, settings.inference_pools) == ("off", "off")
    assert (settings_for(DEFAULTS).pod_monitors, settings_for(DEFAULTS).inference_pools) == (
        "auto",
        "auto",
    )
