"""Helpers of the real-control-plane tier: kubectl, API reads, waiting on conditions, and
the operator run as its own process (`python -m sluice.operator`, as the chart's pod runs it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import cluster_processes  # noqa: E402
import local_cluster  # noqa: E402
from server_process import wait_for  # noqa: E402

T = TypeVar("T")
ISVC = "inferenceservices.sluice.dev"
ISVC_PATH = "/apis/sluice.dev/v1alpha1/namespaces/{ns}/inferenceservices"
CHART_DIR = REPO / "charts" / "sluice"
RELEASE = "sluice"
OPERATOR_NS = "sluice-system"
OPERATOR_SA = "sluice-operator"
SCHEDULING_GRACE_S = 20  # the tier's operator: SLUICE_SCHEDULING_GRACE_SECONDS


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.25,
    explain: Callable[[], str] = lambda: "",
) -> T:
    """Poll `probe` until it returns something truthy, and return that; fail after `timeout`
    with `what` and `explain()` (what the cluster looks like now)."""
    return wait_for(probe, timeout=timeout, every=interval, what=what, explain=explain)


# ----------------------------------------------------------------------------- the tier's build

NO_GO = 3  # scripts/build_control_plane.sh's exit status when there is no `go`


def in_ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")


def build_verdict(returncode: int, stderr: str, env: Mapping[str, str]) -> tuple[str, str]:
    """What the tier does after the build script: ("ok", ""), ("skip", why) or ("fail", why).
    Only a missing Go skips it, and not under CI=true: a CI run that skips ~90 tests would
    look as green as one that ran them."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if returncode == 0:
        return "ok", ""
    if returncode == NO_GO:
        why = last or "no Go toolchain on this machine: the local control plane cannot be built"
        if in_ci(env):
            return "fail", f"CI=true, and the cluster tier cannot run: {why}"
        return "skip", f"{why} (the cluster tier is skipped; under CI=true this fails)"
    return "fail", last or f"control plane build failed (exit status {returncode})"


@dataclass
class Kube:
    """Admin access to the local control plane: kubectl and raw API calls."""

    plane: local_cluster.ControlPlane

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig)}

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        env = self.env if kubeconfig is None else {**os.environ, "KUBECONFIG": str(kubeconfig)}
        result = subprocess.run(
            [str(self.plane.kubectl), *args],
            input=input,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result

    def apply(self, objects: Sequence[Mapping[str, Any]] | Mapping[str, Any], *args: str) -> str:
        docs = [objects] if isinstance(objects, Mapping) else list(objects)
        return self.kubectl(
            "apply", "-f", "-", *args, input=yaml.safe_dump_all([dict(d) for d in docs])
        ).stdout

    def get(self, path: str) -> Any:
        return self.plane.get(path)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        return self.plane.request(method, path, body, content_type or "application/json")

    def try_request(
        self, method: str, path: str, body: Any = None, content_type: str = ""
    ) -> tuple[int, Any]:
        """(HTTP status, decoded body) without raising on 4xx/5xx."""
        try:
            return 200, self.request(method, path, body, content_type)
        except urllib.error.HTTPError as error:
            text = error.read().decode()
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, text

    def create_namespace(self, name: str) -> str:
        self.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": name}}
        )  # fmt: skip
        # pods need the namespace's default ServiceAccount (the controller manager makes it)
        wait_until(
            f"ServiceAccount {name}/default",
            lambda: self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        )
        return name

    def isvc(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.get(ISVC_PATH.format(ns=ns) + f"/{name}")

    def pods(self, ns: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.request.quote(selector)}" if selector else ""
        return self.get(f"/api/v1/namespaces/{ns}/pods{query}")["items"]

    def events(self, ns: str) -> str:
        return self.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp").stdout


def condition(obj: Mapping[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_ready(obj: Mapping[str, Any] | None) -> bool:
    return (condition(obj, "Ready") or {}).get("status") == "True"


# ----------------------------------------------------------------------------- the operator


@dataclass
class OperatorProcess:
    """`python -m sluice.operator` as its own process, with the environment and arguments of
    the chart's operator container, under a kubeconfig of the chart's ServiceAccount token."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    health_url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    _offset: int = field(default=0)

    def start(self) -> None:
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        # its own process group; SIGKILLed by the kernel if the test run dies
        self.process = cluster_processes.popen_group(self.argv, self.log, self.env,
                                                 die_with_parent=True)  # fmt: skip
        if self.health_url:
            wait_until(
                f"the operator's liveness endpoint {self.health_url}",
                self._healthy,
                timeout=90,
                explain=self.tail,
            )

    def _healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the operator exited ({self.process.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as response:  # type: ignore[arg-type]
                return response.status == 200
        except OSError:
            return False

    def output(self) -> str:
        """What this run of the process has logged so far."""
        with open(self.log, "rb") as fh:
            fh.seek(self._offset)
            return fh.read().decode(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def stop(self, sig: int = 15, timeout: float = 30) -> int | None:
        if self.process is None:
            return None
        cluster_processes._stop_group(self.process.pid, timeout) if sig == 15 else os.killpg(
            self.process.pid, sig
        )
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def errors(self) -> list[str]:
        """Lines of a traceback, a handler that raised, or an RBAC denial (403); writes the
        NamespaceLifecycle admission refuses in a namespace being deleted are not counted."""
        return [
            line
            for line in self.output().splitlines()
            if re.search(r"Traceback|failed with an exception|\b403\b|[Ff]orbidden", line)
            # not RBAC: admission refuses writes into a namespace a test deleted at its end
            and "because it is being terminated" not in line
        ]


def token_kubeconfig(plane: local_cluster.ControlPlane, path: Path, token: str) -> Path:
    path.write_text(
        json.dumps(local_cluster.kubeconfig(plane.server, plane.pki / "ca.crt", {"token": token}))
    )
    return path


def service_account_token(kube: Kube, ns: str, name: str, seconds: int = 7200) -> str:
    """A token of ServiceAccount `ns/name` from the TokenRequest API (what a pod is given)."""
    review = kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": seconds}},
    )  # fmt: skip
    return str(review["status"]["token"])


def _operator_container(kube: Kube) -> dict[str, Any]:
    deployment = kube.get(f"/apis/apps/v1/namespaces/{OPERATOR_NS}/deployments/{RELEASE}-operator")
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def operator_process(
    kube: Kube, log: Path, extra_env: dict[str, str] | None = None
) -> OperatorProcess:
    """The chart's operator container as a local process: its command (with this
    interpreter for `python`), its env, under a token of the chart's ServiceAccount.

    The one change: the chart's liveness endpoint listens on 0.0.0.0:8080 inside the pod;
    here it is moved to a free port on 127.0.0.1 (nothing in this tier listens elsewhere)."""
    container = _operator_container(kube)
    command = list(container.get("command") or []) + list(container.get("args") or [])
    # `python -m sluice.operator`, or with peering `/bin/sh -c "... exec python -m ..."`
    assert "python -m sluice.operator" in " ".join(command), command
    if command[0] == "python":
        command[0] = sys.executable
    env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    health = None
    if env.get("SLUICE_LIVENESS_ENDPOINT"):
        port = local_cluster.free_port()
        env["SLUICE_LIVENESS_ENDPOINT"] = re.sub(
            r"//[^/]+", f"//127.0.0.1:{port}", env["SLUICE_LIVENESS_ENDPOINT"], count=1
        )
        health = env["SLUICE_LIVENESS_ENDPOINT"]
    token = service_account_token(kube, OPERATOR_NS, OPERATOR_SA)
    kubeconfig = token_kubeconfig(kube.plane, log.with_suffix(".kubeconfig"), token)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "KUBERNETES_"))}
    process_env = {**base, **env, **(extra_env or {}), "KUBECONFIG": str(kubeconfig)}
    # `python` in a shell command line is this interpreter
    process_env["PATH"] = f"{os.path.dirname(sys.executable)}:{process_env.get('PATH', '')}"
    return OperatorProcess(command, process_env, log, health)
