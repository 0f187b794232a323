"""A local Kubernetes control plane on 127.0.0.1 (issue 24): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok (fake nodes and pods: no containers run) and a
custom/external metrics API server, with their own certificates and an admin kubeconfig.

    python scripts/local_cluster.py up   [--dir DIR] [--bin BIN]  # start it in the background
    python scripts/local_cluster.py down [--dir DIR]              # stop every process it started

`up` installs the CRDs of crds/ (waiting until they are Established) and prints one line to
paste, `export KUBECONFIG=<dir>/admin.kubeconfig PATH=<bin>:$PATH` (<bin> holds the kubectl
of the API server's release). `DIR/state.json` lists every process from the moment it
starts, so `down` stops what `up` left however `up` ended (SIGKILL included); an `up` over a
cluster of which only some processes run stops those and starts afresh.

The test tier (`tests/cluster/`) starts the same `ControlPlane` in-process for a session.
Every listener is bound to 127.0.0.1; the binaries come from `scripts/build_control_plane.sh`
(`make cluster-bin`). Fake nodes: two CPU nodes and two GPU nodes with `nvidia.com/gpu: 2`
allocatable each (GPU nodes are labelled `nvidia.com/gpu.present=true` and tainted
`nvidia.com/gpu:NoSchedule`, as GPU node pools usually are).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# scripts/ is on sys.path: run as a script, or imported by the tests (tests/cluster/conftest.py)
from cluster_processes import (
    Component,
    ControlPlaneError,
    _stop_group,
    all_processes,
    cmdline,
    group_members,
    names_dir,
    proc_stat,
    same_process,
    wait_for,
)

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "build_control_plane.sh"
KWOK_STAGES = REPO / "tools" / "k8s" / "kwok" / "stages.yaml"
HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
METRICS_NAMESPACE = "kube-system"
METRICS_SERVICE = "sluice-metrics-adapter"
# the controller manager's HPA loop: seconds, not the default 15 s, so HPA tests are short
HPA_SYNC_PERIOD = "2s"
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "metrics-adapter",
)


@dataclass(frozen=True)
class FakeNode:
    name: str
    # this node's own pod range, as node IPAM gives a real node: kwok numbers a node's pods
    # from it, and without it every node numbers from the start of --cidr, so pods on two
    # nodes could share an IP (and peered operator replicas, whose priority is their pod
    # IP, a priority)
    pod_cidr: str
    cpu: str = "32"
    memory: str = "128Gi"
    gpus: int = 0

    def manifest(self) -> dict[str, Any]:
        resources = {
            "cpu": self.cpu,
            "memory": self.memory,
            "ephemeral-storage": "500Gi",
            "pods": "110",
        }
        labels = {"type": "kwok", "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux"}
        taints: list[dict[str, str]] = []
        if self.gpus:
            resources[GPU_RESOURCE] = str(self.gpus)
            labels[f"{GPU_RESOURCE}.present"] = "true"
            taints.append({"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            },
            "spec": {"taints": taints, "podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]},
            "status": {"capacity": resources, "allocatable": resources},
        }


DEFAULT_NODES = (
    FakeNode("cpu-node-1", "10.244.1.0/24"),
    FakeNode("cpu-node-2", "10.244.2.0/24"),
    FakeNode("gpu-node-1", "10.244.3.0/24", cpu="32", memory="256Gi", gpus=2),
    FakeNode("gpu-node-2", "10.244.4.0/24", cpu="32", memory="256Gi", gpus=2),
)


def bin_dir() -> Path:
    out = subprocess.run(
        [str(BUILD_SCRIPT), "--print-bin"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ----------------------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(pki: Path, name: str, cn: str) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    _openssl(
        "req", "-x509", "-new", "-nodes", "-key", f"{name}.key", "-sha256", "-days", "3650",
        "-subj", f"/CN={cn}", "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip


def _make_cert(
    pki: Path, name: str, ca: str, subject: str, sans: Sequence[str] = (), server: bool = False
) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    usage = "serverAuth" if server else "clientAuth"
    ext = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
        "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip


def make_pki(pki: Path) -> None:
    """A cluster CA (API server serving cert, admin client cert), a front-proxy CA for the
    aggregation layer, a metrics-adapter serving cert and the service-account key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _make_ca(pki, "ca", "sluice-local-ca")
    _make_ca(pki, "front-proxy-ca", "sluice-local-front-proxy-ca")
    sans = [
        f"IP:{HOST}",
        "DNS:localhost",
        "IP:10.96.0.1",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    _make_cert(pki, "apiserver", "ca", "/CN=kube-apiserver", sans, server=True)
    _make_cert(pki, "admin", "ca", "/O=system:masters/CN=sluice-admin")
    _make_cert(pki, "front-proxy-client", "front-proxy-ca", "/CN=front-proxy-client")
    _make_cert(
        pki, "metrics-adapter", "ca", "/CN=metrics-adapter",
        # the aggregator checks the name of the Service it reached the adapter through
        ["DNS:localhost", f"IP:{HOST}", f"DNS:{METRICS_SERVICE}.{METRICS_NAMESPACE}.svc"],
        server=True,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


# Writes by ServiceAccounts (the operator under its chart account, the router), and their
# reads of Leases (leader election), at the Metadata level (who, verb, object, User-Agent,
# response code; no bodies); nothing else (the controllers and kwok run as admin and would
# fill the log).
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "userGroups": ["system:serviceaccounts"],
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
        },
        {
            "level": "Metadata",
            "userGroups": ["system:serviceaccounts"],
            "verbs": ["get"],
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
        },
        {"level": "None"},
    ],
}

def kubeconfig(server: str, ca: Path, user: Mapping[str, str]) -> dict[str, Any]:
    """A one-cluster, one-user kubeconfig (`user`: client-certificate/-key or token)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": dict(user)}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }


# ----------------------------------------------------------------------------- the control plane


@dataclass
class ControlPlane:
    """The processes of a local control plane under `workdir`; `start()` then `stop()`.

    `state.json` in `workdir` lists every process from the moment it starts (see `down`).
    `die_with_parent`: the components are SIGKILLed when the thread that started them dies
    (the test tier: a killed test run leaves nothing); `make cluster`'s outlive `up`."""

    workdir: Path
    binaries: Path
    nodes: Sequence[FakeNode] = DEFAULT_NODES
    ready_timeout: float = 180.0
    die_with_parent: bool = False
    components: dict[str, Component] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # absolute: the components' command lines name it, and `down` looks for it there
        self.workdir = Path(os.path.abspath(self.workdir))

    @property
    def state_file(self) -> Path:
        return state_file(self.workdir)

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: every write by a ServiceAccount (the operator, the
        router), one JSON event per line (AUDIT_POLICY)."""
        return self.workdir / "audit.log"

    @property
    def server(self) -> str:
        return f"https://{HOST}:{self.ports['apiserver']}"

    @property
    def metrics_write_url(self) -> str:
        return f"http://{HOST}:{self.ports['metrics-write']}/write-metrics"

    @property
    def kubectl(self) -> Path:
        return self.binaries / "kubectl"

    def pids(self) -> dict[str, int]:
        return {name: c.process.pid for name, c in self.components.items() if c.process is not None}

    # -- start
    def start(self, then: Callable[[ControlPlane], None] | None = None) -> None:
        """Start every component and wait until each is ready; then `then(self)` (more set-up
        that belongs to start-up); only then is the state file's phase `running`. On any
        failure, or an exception such as KeyboardInterrupt, what was started is stopped."""
        missing = [b for b in (*COMPONENTS, "kubectl") if not (self.binaries / b).exists()]
        if missing:
            raise ControlPlaneError(
                f"binaries missing in {self.binaries}: {missing} (run `make cluster-bin`)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self._write_state("starting")  # before any process starts
        try:
            make_pki(self.pki)
            for name in ("etcd-client", "etcd-peer", "apiserver", "kcm", "scheduler", "adapter"):
                self.ports[name] = free_port()
            self.ports["metrics-write"] = free_port()
            self._write_kubeconfigs()
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._start_kwok_and_nodes()
            self._start_metrics_adapter()
            self._wait_controllers()
            if then is not None:
                then(self)
        except BaseException:
            self.stop()
            raise
        self._write_state("running")

    def _write_kubeconfigs(self) -> None:
        admin = {
            "client-certificate": str(self.pki / "admin.crt"),
            "client-key": str(self.pki / "admin.key"),
        }
        self.kubeconfig.write_text(
            json.dumps(kubeconfig(self.server, self.pki / "ca.crt", admin), indent=1)
        )

    def _component(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.workdir / "logs" / f"{name}.log")
        self.components[name] = component
        component.start(die_with_parent=self.die_with_parent)
        self._write_state("starting")  # at once: `down` stops it if we die from here on
        return component

    def _start_etcd(self) -> None:
        client = f"http://{HOST}:{self.ports['etcd-client']}"
        peer = f"http://{HOST}:{self.ports['etcd-peer']}"
        etcd = self._component(
            "etcd",
            [
                str(self.binaries / "etcd"),
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=local={peer}",
                "--unsafe-no-fsync=true",  # a throw-away test store: no fsync per write
                "--log-level=warn",
            ],
        )
        wait_for(
            "etcd /health",
            lambda: json.loads(_http_get(f"{client}/health"))["health"] == "true",
            self.ready_timeout,
            etcd.check_alive,
        )

    def _start_apiserver(self) -> None:
        pki = self.pki
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        apiserver = self._component(
            "kube-apiserver",
            [
                str(self.binaries / "kube-apiserver"),
                f"--etcd-servers=http://{HOST}:{self.ports['etcd-client']}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                # the aggregation layer (custom/external metrics API)
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # who wrote what, in the server's own words (tests count requests by
                # User-Agent); blocking: an event is on disk before its response is sent
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxsize=64",
                "--audit-log-maxbackup=1",
                "--profiling=false",
                "--v=1",
            ],
        )
        wait_for(
            "kube-apiserver /readyz",
            lambda: _http_get(f"{self.server}/readyz", self._admin_tls()) == "ok",
            self.ready_timeout,
            apiserver.check_alive,
        )

    def _controller_flags(self, port: str) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={HOST}",
            f"--secure-port={self.ports[port]}",
            "--leader-elect=false",
            "--v=1",
        ]

    def _start_controllers(self) -> None:
        self._component(
            "kube-controller-manager",
            [
                str(self.binaries / "kube-controller-manager"),
                *self._controller_flags("kcm"),
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
                "--horizontal-pod-autoscaler-initial-readiness-delay=1s",
                "--horizontal-pod-autoscaler-cpu-initialization-period=1s",
                "--profiling=false",
            ],
        )
        self._component(
            "kube-scheduler",
            [
                str(self.binaries / "kube-scheduler"),
                *self._controller_flags("scheduler"),
                "--profiling=false",
            ],
        )

    def _wait_controllers(self) -> None:
        for name, port in (("kube-controller-manager", "kcm"), ("kube-scheduler", "scheduler")):
            url = f"https://{HOST}:{self.ports[port]}/healthz"
            wait_for(
                f"{name} /healthz",
                lambda url=url: _http_get(url, _insecure_tls()) == "ok",
                self.ready_timeout,
                self.components[name].check_alive,
            )
        # the service-account controller has made `default` (pods need it)
        wait_for(
            "ServiceAccount default/default",
            lambda: bool(self.get("/api/v1/namespaces/default/serviceaccounts/default")),
            self.ready_timeout,
            self.components["kube-controller-manager"].check_alive,
        )

    def _start_kwok_and_nodes(self) -> None:
        kwok = self._component(
            "kwok",
            [
                str(self.binaries / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={KWOK_STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                f"--node-ip={HOST}",
                "--node-lease-duration-seconds=40",
            ],
        )
        for node in self.nodes:
            self.add_node(node, check_alive=kwok.check_alive)

    def add_node(self, node: FakeNode, check_alive: Callable[[], None] | None = None) -> None:
        """Create a fake node and wait until kwok has made it Ready."""
        self.request("POST", "/api/v1/nodes", node.manifest())
        wait_for(
            f"node {node.name} Ready",
            lambda: _condition(self.get(f"/api/v1/nodes/{node.name}"), "Ready") == "True",
            self.ready_timeout,
            check_alive or self.components["kwok"].check_alive,
        )

    def _start_metrics_adapter(self) -> None:
        kc = str(self.kubeconfig)
        adapter = self._component(
            "metrics-adapter",
            [
                str(self.binaries / "metrics-adapter"),
                f"--lister-kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--bind-address={HOST}",
                f"--secure-port={self.ports['adapter']}",
                f"--tls-cert-file={self.pki / 'metrics-adapter.crt'}",
                f"--tls-private-key-file={self.pki / 'metrics-adapter.key'}",
                f"--write-metrics-address={HOST}:{self.ports['metrics-write']}",
                "--v=1",
            ],
        )
        # The aggregator reaches the adapter through a Service. With no kube-proxy a ClusterIP
        # leads nowhere, and Endpoints may not hold loopback addresses; an ExternalName
        # Service naming `localhost` is resolved by the aggregator itself to localhost:<port>.
        self.request(
            "POST",
            f"/api/v1/namespaces/{METRICS_NAMESPACE}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_SERVICE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            },
        )
        ca = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        for group, version in (
            ("custom.metrics.k8s.io", "v1beta2"),
            ("custom.metrics.k8s.io", "v1beta1"),
            ("external.metrics.k8s.io", "v1beta1"),
        ):
            self.request(
                "POST",
                "/apis/apiregistration.k8s.io/v1/apiservices",
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": {"name": f"{version}.{group}"},
                    "spec": {
                        "group": group,
                        "version": version,
                        "service": {
                            "namespace": METRICS_NAMESPACE,
                            "name": METRICS_SERVICE,
                            "port": self.ports["adapter"],
                        },
                        "caBundle": ca,
                        "groupPriorityMinimum": 100,
                        "versionPriority": 200 if version == "v1beta2" else 100,
                    },
                },
            )
        for group, version in (
            ("custom.metrics.k8s.io", "v1beta2"),
            ("external.metrics.k8s.io", "v1beta1"),
        ):
            wait_for(
                f"APIService {version}.{group} Available",
                lambda n=f"{version}.{group}": (
                    _condition(
                        self.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{n}"), "Available"
                    )
                    == "True"
                ),
                self.ready_timeout,
                adapter.check_alive,
            )

    # -- API access (admin)
    def _admin_tls(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self._admin_tls(), timeout=30) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def get(self, path: str) -> Any:
        """The object at `path`, or None when it does not exist (404)."""
        try:
            return self.request("GET", path)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def write_pod_metric(self, namespace: str, pod: str, metric: str, value: str) -> None:
        """Set a Pods metric in the custom metrics API (what prometheus-adapter would serve)."""
        req = urllib.request.Request(
            f"{self.metrics_write_url}/namespaces/{namespace}/pods/{pod}/{metric}",
            data=json.dumps(value).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as response:
            response.read()

    # -- stop
    def stop(self, timeout: float = 15.0) -> None:
        """Stop every component (last started first) and wait until each process is gone."""
        for component in reversed(list(self.components.values())):
            if component.process is not None:
                _stop_group(component.process.pid, timeout, component.start_time)
                try:
                    component.process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    component.process.kill()
                    component.process.wait()
        if self.state_file.exists():
            self._write_state("stopped")

    # -- state for `down` (make cluster runs `up` and `down` as separate commands)
    def _write_state(self, phase: str) -> None:
        me = proc_stat(os.getpid())
        write_state(
            self.workdir,
            {
                "phase": phase,  # starting, running, stopped
                "dir": str(self.workdir),
                "logs": str(self.workdir / "logs"),
                "binaries": str(self.binaries),
                "kubeconfig": str(self.kubeconfig),
                # the process that starts the components (`up`, or a test run)
                "owner": {"pid": os.getpid(), "start": me.start if me else None},
                "processes": {name: c.record() for name, c in self.components.items() if c.process},
                "ports": self.ports,
            },
        )


def _condition(obj: Mapping[str, Any] | None, kind: str) -> str | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _insecure_tls() -> ssl.SSLContext:
    # only for the /healthz of a component with a self-signed serving cert, on loopback
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_get(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        return str(response.read().decode())


# ----------------------------------------------------------------------------- state and CLI

CRDS_DIR = REPO / "crds"


def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sluice" / "cluster"


def state_file(workdir: Path) -> Path:
    return workdir / "state.json"


def write_state(workdir: Path, state: Mapping[str, Any]) -> None:
    """Replace the state file in one step (a reader, or a kill mid-write, never sees half)."""
    path = state_file(workdir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def read_state(workdir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(state_file(workdir).read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # not ours, or torn: what it lists cannot be trusted
        return {"phase": "unreadable", "processes": {}}
    if "pids" in state and "processes" not in state:  # the format before issue 37
        state["processes"] = {n: {"pid": p, "pgid": p, "start": None}
                              for n, p in state["pids"].items()}  # fmt: skip
        state.setdefault("phase", "running")
    return dict(state)


def leftover_processes(workdir: Path) -> list[int]:
    """Processes of a component binary whose command line names `workdir`: what a cluster
    there left running, listed in the state file or not (never this process or its
    ancestors, e.g. the `down --dir ...` command line itself)."""
    mine = set()
    pid: int | None = os.getpid()
    while pid and pid not in mine:
        mine.add(pid)
        stat = proc_stat(pid)
        pid = stat.ppid if stat else None
    found = []
    for stat in all_processes():
        if stat.pid in mine or stat.state == "Z":
            continue
        argv = cmdline(stat.pid)
        if argv and Path(argv[0]).name in COMPONENTS and names_dir(argv, workdir):
            found.append(stat.pid)
    return found


@dataclass(frozen=True)
class Health:
    phase: str
    alive: list[str]
    dead: list[str]
    starting_owner: int | None  # an `up` still starting this cluster

    @property
    def running(self) -> bool:
        return self.phase == "running" and not self.dead and set(self.alive) >= set(COMPONENTS)


def health(state: Mapping[str, Any]) -> Health:
    alive, dead = [], []
    for name, rec in state.get("processes", {}).items():
        (alive if same_process(int(rec["pid"]), rec.get("start")) else dead).append(name)
    owner = state.get("owner") or {}
    starting = None
    if (
        state.get("phase") == "starting"
        and owner.get("pid")
        and owner["pid"] != os.getpid()
        and same_process(int(owner["pid"]), owner.get("start"))
    ):
        starting = int(owner["pid"])
    return Health(str(state.get("phase")), alive, dead, starting)


def down(workdir: Path, quiet: bool = False) -> int:
    """Stop whatever a cluster in `workdir` has running, whatever became of the `up` that
    started it: the `up` itself when it is still starting, each process group the state
    file lists (last started first), then any component process still naming `workdir`."""
    workdir = Path(os.path.abspath(workdir))
    say = (lambda *a, **k: None) if quiet else print
    state = read_state(workdir)
    if state is None and not leftover_processes(workdir):
        say(f"no local cluster in {workdir}")
        return 0
    state = state or {"processes": {}}
    now = health(state)
    if now.starting_owner is not None:  # it would go on starting components: stop it first
        owner = state["owner"]
        _stop_group_or_pid(int(owner["pid"]), owner.get("start"))
    records = list(state.get("processes", {}).items())
    for _name, rec in reversed(records):
        _stop_group(int(rec.get("pgid", rec["pid"])), 15.0, rec.get("start"))
    for pid in leftover_processes(workdir):
        _stop_group_or_pid(pid, None)
    left = [n for n, rec in records if group_members(int(rec.get("pgid", rec["pid"])),
                                                     rec.get("start"))]  # fmt: skip
    left += [f"pid {pid}: {' '.join(cmdline(pid))[:120]}" for pid in leftover_processes(workdir)]
    if left:
        print(f"local cluster in {workdir}: still running: {left}", file=sys.stderr)
        return 1
    state_file(workdir).unlink(missing_ok=True)
    say(f"local cluster in {workdir} stopped")
    return 0


def _stop_group_or_pid(pid: int, start: int | None) -> None:
    """Stop `pid`'s whole group when it leads one, else `pid` alone (SIGTERM, then SIGKILL)."""
    stat = proc_stat(pid)
    if stat is None or (start is not None and stat.start != start):
        return
    if stat.pgid == pid:
        _stop_group(pid, 15.0, stat.start)
        return
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while same_process(pid, stat.start) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not same_process(pid, stat.start):
            return


def install_crds(plane: ControlPlane) -> None:
    """`kubectl apply -f crds/`, then wait until each CRD is Established (its API is served)."""
    applied = subprocess.run(
        [str(plane.kubectl), "apply", "-f", str(CRDS_DIR), "-o", "name"],
        env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if applied.returncode != 0:
        raise ControlPlaneError(f"kubectl apply -f {CRDS_DIR} failed:\n{applied.stderr}")
    for line in applied.stdout.split():
        name = line.split("/", 1)[1]
        wait_for(
            f"CRD {name} Established",
            lambda name=name: (
                _condition(
                    plane.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"),
                    "Established",
                )
                == "True"
            ),
            plane.ready_timeout,
        )


def paste_line(kubeconfig_path: Path, binaries: Path) -> str:
    """The one line `up` prints: the cluster's kubeconfig, and the kubectl of the API
    server's release first on PATH (a system kubectl may be several minor versions older)."""
    return (
        f"export KUBECONFIG={shlex.quote(str(kubeconfig_path))} "
        f"PATH={shlex.quote(str(binaries))}:$PATH"
    )


def _raise_on_signals() -> None:
    """SIGTERM / SIGHUP (a closed terminal) during `up`: stop what was started, as Ctrl-C
    does, instead of leaving it half-started (SIGKILL cannot be caught: that is `down`'s)."""

    def handler(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def up(workdir: Path, binaries: Path | None = None) -> int:
    workdir = Path(os.path.abspath(workdir))
    state = read_state(workdir)
    if state is not None or leftover_processes(workdir):
        now = health(state or {"phase": "unrecorded"})
        if now.starting_owner is not None:
            print(f"local cluster in {workdir}: `up` (pid {now.starting_owner}) is starting "
                  "it; wait for it, or run `down`", file=sys.stderr)  # fmt: skip
            return 1
        if now.running and _api_ready(state or {}):
            print(f"local cluster in {workdir} is already running", file=sys.stderr)
            print(paste_line(Path(state["kubeconfig"]), Path(state["binaries"])))  # type: ignore[index]
            return 0
        leftovers = leftover_processes(workdir)
        if now.alive or leftovers:  # some of it runs, not all of it: never report that as up
            print(
                f"local cluster in {workdir} is degraded (phase {now.phase}; alive: {now.alive}; "
                f"dead: {now.dead}; unrecorded: {len(leftovers)} process(es)): stopping what is "
                "left and starting afresh",
                file=sys.stderr,
            )
        if down(workdir, quiet=True) != 0:
            return 1
    if binaries is None:
        build = subprocess.run([str(BUILD_SCRIPT)])
        if build.returncode != 0:
            return build.returncode
        binaries = bin_dir()
    if workdir.exists():  # a stopped cluster's leftovers: start from an empty store
        subprocess.run(["rm", "-rf", str(workdir)], check=True)
    _raise_on_signals()
    plane = ControlPlane(workdir, binaries)
    try:
        plane.start(then=install_crds)
    except ControlPlaneError as error:
        print(f"local cluster did not start: {error}", file=sys.stderr)
        return 1
    version = plane.get("/version")["gitVersion"]
    print(
        f"local cluster running: Kubernetes {version} at {plane.server}, "
        f"{len(plane.nodes)} fake nodes, the CRDs of {CRDS_DIR.name}/ installed, logs in "
        f"{workdir / 'logs'}; the kubectl of its release is {plane.kubectl} (a system kubectl "
        "may be older). To use it, paste:",
        file=sys.stderr,
    )
    print(paste_line(plane.kubeconfig, binaries), flush=True)
    return 0


def _api_ready(state: Mapping[str, Any]) -> bool:
    """The API server the state file names answers /readyz with the cluster's credentials."""
    try:
        plane = ControlPlane(
            Path(state["dir"]), Path(state["binaries"]), ports=dict(state["ports"])
        )
        return _http_get(f"{plane.server}/readyz", plane._admin_tls()) == "ok"
    except (OSError, ssl.SSLError, KeyError, TypeError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--dir", type=Path, default=default_dir(), help="state and logs")
    parser.add_argument(
        "--bin", type=Path, default=None,
        help="the control plane's binaries (default: build or find them with "
        "scripts/build_control_plane.sh)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    binaries = args.bin.resolve() if args.bin else None
    return up(args.dir, binaries) if args.command == "up" else down(args.dir)


if __name__ == "__main__":
    sys.exit(main())
