#!/usr/bin/env bash
# Copy the files the Helm chart ships from their single sources into charts/sluice/.
# Helm can only read files inside the chart, so the chart keeps copies; tests/chart fails
# when a copy differs from its source. Run this after changing any of the sources:
#
#   crds/inferenceservice.yaml                 -> charts/sluice/crds/inferenceservice.yaml
#   monitoring/grafana/sluice-dashboard.json   -> charts/sluice/files/grafana/
#   monitoring/prometheus/alerts.yaml          -> charts/sluice/files/prometheus/
#   monitoring/prometheus/saturation.yaml      -> charts/sluice/files/prometheus/
#   monitoring/prometheus-adapter/rules.yaml   -> charts/sluice/files/prometheus-adapter/
#   the same rules as prometheus-adapter chart values -> charts/sluice/files/prometheus-adapter-values.yaml
#   operator/src/sluice/operator/rbac.py (REQUIRED_PERMISSIONS)    -> charts/sluice/files/operator-rbac.yaml
#
# Usage: scripts/sync_chart_assets.sh            (PYTHON defaults to .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
CHART=charts/sluice
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3

copy() {  # copy SRC DEST_DIR
    mkdir -p "$2"
    cp "$1" "$2/"
    echo "synced $1 -> $2/"
}

copy crds/inferenceservice.yaml "$CHART/crds"
copy monitoring/grafana/sluice-dashboard.json "$CHART/files/grafana"
copy monitoring/prometheus/alerts.yaml "$CHART/files/prometheus"
copy monitoring/prometheus/saturation.yaml "$CHART/files/prometheus"
copy monitoring/prometheus-adapter/rules.yaml "$CHART/files/prometheus-adapter"

# The adapter rules as values for the prometheus-community/prometheus-adapter chart: the
# list under `rules:` in rules.yaml goes under `rules.custom`, the one under
# `externalRules:` under `rules.external`, comments kept.
adapter_values="$CHART/files/prometheus-adapter-values.yaml"
{
    cat <<'EOF'
# Values for the prometheus-community/prometheus-adapter chart that serve the Sluice
# scheduler's per-pod signals as custom metrics (custom.metrics.k8s.io), under the names
# the operator's HorizontalPodAutoscalers ask for. Generated from
# monitoring/prometheus-adapter/rules.yaml by scripts/sync_chart_assets.sh: do not edit.
#
#   helm install prometheus-adapter prometheus-community/prometheus-adapter \
#     --namespace monitoring -f charts/sluice/files/prometheus-adapter-values.yaml
#
# prometheus.url must reach your Prometheus; the default is the Service that
# kube-prometheus-stack creates when installed as release `kube-prometheus-stack` in the
# namespace `monitoring`.
prometheus:
  url: http://kube-prometheus-stack-prometheus.monitoring.svc
  port: 9090
rules:
  # the adapter's built-in rules expose every series as a custom metric; not needed here
  default: false
  custom:
EOF
    # the lines between `rules:` and `externalRules:` (the rule list, and the comment that
    # introduces the external rules), indented to sit under `custom:`
    sed -n '/^rules:/,/^externalRules:/p' monitoring/prometheus-adapter/rules.yaml | sed -e '1d;$d' \
        | sed -e 's/^\(.\)/  \1/'
    echo "  external:"
    sed -n '/^externalRules:/,$p' monitoring/prometheus-adapter/rules.yaml | tail -n +2 \
        | sed -e 's/^\(.\)/  \1/'
} >"$adapter_values"
echo "generated $adapter_values"

# The operator's permission table, as data the RBAC templates iterate over.
rbac="$CHART/files/operator-rbac.yaml"
"$PYTHON" - "$rbac" <<'EOF'
import importlib.util
import sys

import yaml

spec = importlib.util.spec_from_file_location("sluice_operator_rbac", "operator/src/sluice/operator/rbac.py")
rbac = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = rbac  # dataclasses look their module up while building the class
spec.loader.exec_module(rbac)
permissions = [
    {
        "apiGroup": p.api_group,
        "resource": p.resource,
        "verbs": list(p.verbs),
        "scope": p.scope,
        "when": p.when,
        "why": p.why,
    }
    for p in rbac.REQUIRED_PERMISSIONS
]
header = (
    "# Every Kubernetes API permission the operator uses, generated from\n"
    "# operator/src/sluice/operator/rbac.py (REQUIRED_PERMISSIONS) by scripts/sync_chart_assets.sh: do not edit.\n"
    "# templates/rbac.yaml builds the ClusterRole/Roles from it (see _helpers.tpl,\n"
    "# sluice.permissionWanted, for which settings turn each `when` on).\n"
)
with open(sys.argv[1], "w") as out:
    out.write(header)
    yaml.safe_dump({"permissions": permissions}, out, sort_keys=False, width=100)
print(f"generated {sys.argv[1]}")
EOF
