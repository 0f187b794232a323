"""`helm lint --strict` (Helm's own SDK) is clean for the default values and for every
optional feature turned on, against Kubernetes 1.30."""

from __future__ import annotations

import helm_python as helm
import pytest
from chart_testkit import ALL_ON, CHART_DIR, DEFAULTS, NAMESPACED_ALL_ON

WARNING = 2  # lint severities: 1 info, 2 warning, 3 error


@pytest.mark.parametrize(
    "values",
    [DEFAULTS, ALL_ON, NAMESPACED_ALL_ON],
    ids=["defaults", "all-features", "namespaced-all-features"],
)
def test_lint_is_clean_in_strict_mode(values):
    report = helm.lint(CHART_DIR, values, strict=True, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert report["errors"] == [] and problems == [], problems or report["errors"]


def test_lint_reports_values_the_schema_rejects():
    report = helm.lint(CHART_DIR, {"operator": {"logFormat": "xml"}}, strict=True)
    assert any("/operator/logFormat" in error for error in report["errors"])


def test_chart_metadata_names_the_app_version_and_kubernetes_range():
    with helm.Chart.load(CHART_DIR) as chart:
        meta = chart.metadata
    assert meta["name"] == "sluice" and meta["apiVersion"] == "v2"
    assert meta["appVersion"] and meta["kubeVersion"].startswith(">=1.28")
