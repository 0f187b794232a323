"""What the chart installs serves spec.disaggregation: its CRD carries the field (and the
status of both pools, which the Ready and Desired columns sum), its RBAC lets the operator write and delete
every child of either shape, and the prometheus-adapter values it ships serve every metric
a pool's HPA reads."""

from __future__ import annotations

import yaml
from chart_testkit import CHART_DIR, DEFAULTS, crd_objects, render_objects
from test_chart_rbac import allows

from sluice.operator import constants as c
from sluice.operator.children import plan
from sluice.operator.kube import resource_of
from sluice.operator.parsing import parse_spec
from sluice.operator.spec import HPA_METRICS

PD_SPEC = {
    "model": {"source": "bundled://smollm2-135m"},
    "disaggregation": {
        "enabled": True,
        "prefill": {"autoscaling": {"enabled": True}},
        "decode": {"autoscaling": {"enabled": True}},
    },
    "networkPolicy": {"enabled": True},
}


def version(crd: dict) -> dict:
    return crd["spec"]["versions"][0]


def test_the_crd_the_chart_installs_carries_the_pools():
    [crd] = crd_objects()
    schema = version(crd)["schema"]["openAPIV3Schema"]["properties"]
    pools = schema["spec"]["properties"]["disaggregation"]["properties"]

    assert set(pools) == {"enabled", "prefill", "decode", "bootstrapPort"}
    assert pools["bootstrapPort"]["default"] == 8998
    assert set(schema["status"]["properties"]["disaggregation"]["properties"]) == set(c.ROLES)
    columns = {
        col["name"]: col.get("description", "") for col in version(crd)["additionalPrinterColumns"]
    }
    assert "both pools" in columns["Ready"] and "both pools" in columns["Desired"]
    annotation = crd["metadata"]["annotations"][c.ANNOTATION_SCHEMA_VERSION]
    assert annotation == str(c.CRD_SCHEMA_VERSION)


def test_the_operators_rbac_covers_every_child_of_both_shapes():
    objects = render_objects(DEFAULTS)
    for spec in (PD_SPEC, {**PD_SPEC, "disaggregation": {"enabled": False}}):
        the_plan = plan(parse_spec("chat", "team-a", spec, default_image="i"), podmonitors=None)
        applied = {resource_of(obj) for obj in the_plan.apply}
        removed = {resource for resource, _ in the_plan.remove}
        for resource in applied:
            for verb in ("get", "create", "patch"):
                assert allows(objects, "team-a", resource.group, resource.plural, verb), resource
        for resource in removed:
            assert allows(objects, "team-a", resource.group, resource.plural, "delete"), resource


def test_the_adapter_values_serve_every_metric_a_pool_scales_on():
    values = yaml.safe_load((CHART_DIR / "files" / "prometheus-adapter-values.yaml").read_text())
    served = {rule["name"]["as"] for rule in values["rules"]["custom"]}
    pool_metrics = {t for types in c.POOL_METRIC_TYPES.values() for t in types}

    assert {HPA_METRICS[t] for t in pool_metrics} <= served
