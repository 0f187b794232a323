#!/usr/bin/env bash
# End-to-end on kind (CPU only, no GPU needed): create a kind cluster, build the operator
# image and the CPU runtime image, load them into the cluster, and run `pytest e2e`
# (install the chart, serve samples/smollm2-cpu.yaml, chat through the Service, load it
# and watch the queue-depth metric rise).
#
#   e2e/kind.sh                  # needs docker, kind, kubectl and the dev venv (make setup)
#   KEEP_CLUSTER=1 e2e/kind.sh   # leave the cluster running afterwards
#   e2e/kind.sh -k queue         # extra arguments go to pytest
#
# The runtime pod needs about 2.5 GiB of memory and 2 CPUs; give Docker at least 4 GiB.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-sluice-e2e}
TAG=${TAG:-e2e}
PY=${PY:-.venv/bin/python}
OPERATOR_IMAGE=sluice-operator:$TAG
RUNTIME_IMAGE=sluice-runtime:$TAG-cpu
ROUTER_IMAGE=sluice-router:$TAG

for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null || { echo "e2e/kind.sh: $tool is not installed" >&2; exit 1; }
done

created=0
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    kind create cluster --name "$CLUSTER" --wait 120s
    created=1
fi
export KUBECONFIG
KUBECONFIG=$(mktemp)
cleanup() {
    rm -f "$KUBECONFIG"
    if [ "$created" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then
        kind delete cluster --name "$CLUSTER"
    fi
}
trap cleanup EXIT
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

docker build --target operator -t "$OPERATOR_IMAGE" .
docker build --target runtime --build-arg DEVICE=cpu -t "$RUNTIME_IMAGE" .
docker build --target router -t "$ROUTER_IMAGE" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$RUNTIME_IMAGE" "$ROUTER_IMAGE"

SLUICE_E2E_OPERATOR_IMAGE=$OPERATOR_IMAGE SLUICE_E2E_RUNTIME_IMAGE=$RUNTIME_IMAGE \
    SLUICE_E2E_ROUTER_IMAGE=$ROUTER_IMAGE \
    "$PY" -m pytest e2e -v -rs "$@"
