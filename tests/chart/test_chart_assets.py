"""The files the chart ships are copies of their single sources (scripts/sync_chart_assets.sh
makes them), and the monitoring objects carry them unchanged."""

from __future__ import annotations

import pytest
from chart_testkit import ALL_ON, CHART_DIR, REPO, chart, load_yaml, one, render_objects

SYNC = "run scripts/sync_chart_assets.sh"
COPIES = {
    "crds/inferenceservice.yaml": "crds/inferenceservice.yaml",
    "monitoring/grafana/sluice-dashboard.json": "files/grafana/sluice-dashboard.json",
    "monitoring/prometheus/alerts.yaml": "files/prometheus/alerts.yaml",
    "monitoring/prometheus/saturation.yaml": "files/prometheus/saturation.yaml",
    "monitoring/prometheus-adapter/rules.yaml": "files/prometheus-adapter/rules.yaml",
}


@pytest.mark.parametrize("source", COPIES)
def test_chart_copy_is_identical_to_its_source(source):
    copy = CHART_DIR / COPIES[source]
    assert copy.read_bytes() == (REPO / source).read_bytes(), f"{copy} differs: {SYNC}"


def test_helm_installs_the_crd_exactly_as_written():
    [crd] = [c for c in chart().crds if c["name"].endswith("inferenceservice.yaml")]
    assert crd["data"] == (REPO / "crds/inferenceservice.yaml").read_text()


def test_prometheus_adapter_values_hold_the_adapter_rules():
    values = load_yaml(CHART_DIR / "files/prometheus-adapter-values.yaml")
    rules = load_yaml(REPO / "monitoring/prometheus-adapter/rules.yaml")
    assert values["rules"]["custom"] == rules["rules"], SYNC
    assert values["rules"]["external"] == rules["externalRules"], SYNC
    assert values["rules"]["default"] is False
    assert values["prometheus"]["url"].startswith("http")


def test_grafana_configmap_holds_the_dashboard_unchanged():
    config_map = one(render_objects(ALL_ON), "ConfigMap")
    dashboard = (REPO / "monitoring/grafana/sluice-dashboard.json").read_text()
    assert config_map["data"] == {"sluice-dashboard.json": dashboard}
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_prometheus_rule_holds_the_alert_and_saturation_groups_unchanged():
    rule = one(render_objects(ALL_ON), "PrometheusRule")
    alerts = load_yaml(REPO / "monitoring/prometheus/alerts.yaml")
    saturation = load_yaml(REPO / "monitoring/prometheus/saturation.yaml")
    assert rule["spec"] == {"groups": alerts["groups"] + saturation["groups"]}
    # Prometheus' own templates survive Helm's: they are data, never rendered by Helm
    assert "{{ $labels.pod }}" in str(rule["spec"])
