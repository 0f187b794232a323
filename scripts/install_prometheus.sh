#!/usr/bin/env bash
# Install Prometheus and promtool (Debian package `prometheus`) if they are missing.
# Used by tests/metrics to run a real Prometheus against the runtime; idempotent.
# The package may start a system service on install: the tests never rely on it, they run
# their own `prometheus` with their own config and storage on a loopback port.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install_prometheus.sh: need root for apt-get (or install the 'prometheus' package)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null
