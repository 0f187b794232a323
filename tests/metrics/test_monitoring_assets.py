"""The monitoring assets without a live Prometheus: the Grafana dashboard, the alert rules
(`promtool check rules` and `promtool test rules`), and the prometheus-adapter rules; every
PromQL expression in them parses (through `promtool check rules` on a generated rule
file) and reads only metrics that exist."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from metrics_testkit import (
    ADAPTER_RULES,
    ALERTS,
    ALERTS_TEST,
    CONSTANT_METRICS,
    DOCUMENTED,
    adapter_external_rules,
    adapter_rules,
    alert_queries,
    alert_rules,
    all_queries,
    dashboard,
    dashboard_panels,
    dashboard_queries,
    metric_names,
    saturation_rules,
    substitute,
)

from sluice.runtime import constants as C

# kube-state-metrics series the alerts join on (Deployments, HPAs, pods)
KUBE_STATE_METRICS = {
    "kube_deployment_status_replicas_available",
    "kube_deployment_spec_replicas",
    "kube_deployment_labels",
    "kube_horizontalpodautoscaler_status_current_replicas",
    "kube_horizontalpodautoscaler_spec_max_replicas",
    "kube_horizontalpodautoscaler_status_condition",
    "kube_horizontalpodautoscaler_labels",
    "kube_pod_container_status_waiting_reason",
    "kube_pod_init_container_status_waiting_reason",
    "kube_pod_labels",
}
SELECTOR = re.compile(r"(sluice_[a-z0-9_]+)\{([^}]*)\}")


# --- the dashboard ------------------------------------------------------------------------------
def test_dashboard_is_a_grafana_dashboard_with_model_and_namespace_variables():
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "model"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
        assert f", {name})" in v["query"]["query"]


def test_dashboard_panels_have_unique_ids_and_do_not_overlap():
    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_every_dashboard_query_uses_the_datasource_and_both_variables():
    for p in dashboard_panels():
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
    for q in dashboard_queries():
        selectors = SELECTOR.findall(q.expr)
        assert selectors, q.source
        for metric, matchers in selectors:
            assert 'namespace=~"$namespace"' in matchers, (q.source, metric)
            assert 'model=~"$model"' in matchers, (q.source, metric)


def test_dashboard_references_only_metrics_that_exist():
    exprs = [q.expr for q in dashboard_queries()]
    exprs += [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    used = set().union(*(metric_names(e) for e in exprs))
    assert used <= CONSTANT_METRICS, used - CONSTANT_METRICS


@pytest.mark.parametrize(
    "metric",
    [
        C.METRIC_QUEUE_REQUESTS,
        C.METRIC_RUNNING_REQUESTS,
        C.METRIC_KV_TOKEN_USAGE,
        C.METRIC_NEW_TOKEN_RATIO,
        C.METRIC_RETRACTIONS_TOTAL,
        C.METRIC_GENERATION_THROUGHPUT,
        C.METRIC_PREFIX_CACHE_HIT_RATIO,
        C.METRIC_REQUESTS_TOTAL,
    ],
)
def test_dashboard_has_a_panel_for(metric):
    assert any(metric in metric_names(q.expr) for q in dashboard_queries())


@pytest.mark.parametrize(
    "histogram",
    [
        C.METRIC_TTFT_SECONDS,
        C.METRIC_ITL_SECONDS,
        C.METRIC_E2E_SECONDS,
        C.METRIC_QUEUE_TIME_SECONDS,
    ],
)
def test_dashboard_shows_p50_and_p99_of(histogram):
    exprs = [q.expr for q in dashboard_queries() if histogram + "_bucket" in q.expr]
    for quantile in ("0.5", "0.99"):
        assert any(e.startswith(f"histogram_quantile({quantile},") for e in exprs), quantile


# --- alert rules --------------------------------------------------------------------------------
def test_alert_rules_pass_promtool_check(prometheus_tools):
    done = subprocess.run(
        [prometheus_tools.promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_fire_on_their_patterns_and_not_on_near_misses(prometheus_tools):
    done = subprocess.run(
        [prometheus_tools.promtool, "test", "rules", ALERTS_TEST.name],
        cwd=ALERTS_TEST.parent, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_four_alerts_exist_with_severity_and_explanations():
    rules = {r["alert"]: r for r in alert_rules()}
    for name in (
        "SluiceQueueGrowingKVNearFull",
        "SluiceSustainedRetractions",
        "SluiceTimeToFirstTokenHigh",
        "SluiceNoReadyReplicas",
    ):
        rule = rules[name]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert rule["for"]


def test_alerts_read_only_sluice_and_kube_state_metrics():
    used = set().union(*(metric_names(q.expr) for q in alert_queries()))
    assert used <= CONSTANT_METRICS | KUBE_STATE_METRICS, used


def test_the_no_ready_replicas_alert_selects_the_operators_deployments():
    oc = pytest.importorskip("sluice.operator.constants")
    label = "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", oc.LABEL_NAME)
    rule = next(r for r in alert_rules() if r["alert"] == "SluiceNoReadyReplicas")
    assert f'{label}="{oc.APP_NAME}"' in rule["expr"]


# --- prometheus-adapter --------------------------------------------------------------------------
def test_adapter_exposes_the_hpa_metrics_per_pod():
    rules = adapter_rules()
    assert {r["name"]["as"] for r in rules} == {
        C.HPA_METRIC_QUEUE_DEPTH,
        C.HPA_METRIC_KV_TOKEN_USAGE,
        C.METRIC_QUEUE_PROMPT_TOKENS,  # a P/D prefill pool
        C.METRIC_RUNNING_REQUESTS,  # a P/D decode pool
        C.METRIC_DISAGG_WAITING_REQUESTS,
    }
    for r in rules:
        assert r["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert re.fullmatch(r["name"]["matches"], r["name"]["as"])
        assert r["seriesQuery"].startswith(r["name"]["as"] + "{")
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert placeholder in r["metricsQuery"]
        assert DOCUMENTED[r["name"]["as"]] == "gauge"


def test_adapter_rules_file_is_the_adapters_config_shape():
    doc = yaml.safe_load(ADAPTER_RULES.read_text())
    assert list(doc) == ["rules", "externalRules"]


def test_adapter_serves_the_saturation_count_as_an_external_metric():
    (rule,) = adapter_external_rules()
    assert rule["name"]["as"] == C.HPA_METRIC_SATURATION
    assert re.fullmatch(rule["name"]["matches"], C.SATURATION_RECORDED_METRIC)
    assert rule["seriesQuery"].startswith(C.SATURATION_RECORDED_METRIC + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}}
    # one series per InferenceService: the HPA sums what the selector matches
    assert f"by (namespace, {C.SATURATION_SERVICE_LABEL})" in rule["metricsQuery"]
    recorded = {r["record"] for r in saturation_rules()}
    assert C.SATURATION_RECORDED_METRIC in recorded


# --- every expression parses --------------------------------------------------------------------
def test_every_promql_expression_parses(prometheus_tools, tmp_path):
    """`promtool check rules` on a rule file recording each expression (as sent)."""
    queries = all_queries()
    rules = [
        {"record": f"sluice_check:q{i}", "expr": substitute(q, "ns", "m", "pod-0", "1m")}
        for i, q in enumerate(queries)
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    done = subprocess.run(
        [prometheus_tools.promtool, "check", "rules", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(queries)} rules found" in done.stdout
