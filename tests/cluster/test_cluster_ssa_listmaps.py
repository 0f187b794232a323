"""The API emulator's server-side apply (tests/operator/field_managers.py) against its
oracle, the real kube-apiserver: the same sequence of applies, conflicts and patches by
several field managers runs on both, and the objects and `metadata.managedFields`
(manager → fieldsV1) must come out the same, modulo timestamps.

The sequence exercises list-maps: two managers share a Deployment's containers and a
container's env vars (keyed by name), ports (containerPort+protocol, the protocol
defaulted in the key), volumeMounts (mountPath) and volumes; an applier that stops sending
an item releases it (removed when nobody else owns it, kept when someone does); a changed
field of an item someone else owns is a conflict (409, the same message), unless forced.

Only the managers of the sequence are compared: on the real server the Deployment
controller writes too (status, the revision annotation), into fields nobody here sets; and
the real object's server defaults (imagePullPolicy, protocol...) are not compared, only
every field the emulator holds (`projection`)."""

from __future__ import annotations

import copy
import json
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_kit import Kube

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from operator_cluster import Cluster  # noqa: E402

APPLY = "application/apply-patch+yaml"
MANAGERS = ("alpha", "beta", "gamma")


class Server:
    """One API server, real or emulated, as the sequence uses it."""

    def __init__(self, name: str, call: Any, ns: str) -> None:
        self.name, self._call, self.ns = name, call, ns

    def path(self, kind: str, name: str) -> str:
        api = "/apis/apps/v1" if kind == "deployments" else "/api/v1"
        return f"{api}/namespaces/{self.ns}/{kind}/{name}"

    def apply(self, manager: str, obj: dict[str, Any], *, force: bool = False) -> tuple[int, Any]:
        query = urllib.parse.urlencode({"fieldManager": manager, "force": str(force).lower()})
        kind = {"Deployment": "deployments", "Service": "services"}[obj["kind"]]
        body = {**obj, "metadata": {**obj["metadata"], "namespace": self.ns}}
        return self._call("PATCH", f"{self.path(kind, obj['metadata']['name'])}?{query}", body,
                          APPLY)  # fmt: skip

    def json_patch(self, manager: str, kind: str, name: str, ops: list[Any]) -> tuple[int, Any]:
        query = urllib.parse.urlencode({"fieldManager": manager})
        return self._call("PATCH", f"{self.path(kind, name)}?{query}", ops,
                          "application/json-patch+json")  # fmt: skip

    def get(self, kind: str, name: str) -> dict[str, Any]:
        code, obj = self._call("GET", self.path(kind, name), None, "application/json")
        assert code == 200, (self.name, obj)
        return dict(obj)


def real_server(kube: Kube, ns: str) -> Server:
    return Server("kube-apiserver", kube.try_request, ns)


def emulated_server(cluster: Cluster, ns: str) -> Server:
    def call(method: str, path: str, body: Any, content_type: str) -> tuple[int, Any]:
        where, _, query = path.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        return cluster.request(method, where, body, content_type, params=params)

    return Server("emulator", call, ns)


@pytest.fixture(scope="module")
def emulator() -> Iterator[Cluster]:
    cluster = Cluster()
    yield cluster
    cluster.close()


def managed(obj: dict[str, Any]) -> dict[tuple[str, str, str], Any]:
    """manager → fieldsV1, for the managers of the sequence."""
    return {
        (e["manager"], e["operation"], e.get("subresource", "")): e["fieldsV1"]
        for e in obj["metadata"].get("managedFields") or []
        if e["manager"] in MANAGERS
    }


def projection(real: Any, emulated: Any) -> Any:
    """`real` cut to the fields `emulated` has (the server's defaults left out); lists of
    different lengths are kept whole, so they differ."""
    if isinstance(real, dict) and isinstance(emulated, dict):
        return {k: projection(real[k], v) for k, v in emulated.items() if k in real}
    if isinstance(real, list) and isinstance(emulated, list) and len(real) == len(emulated):
        return [projection(r, e) for r, e in zip(real, emulated, strict=True)]
    return real


def same_outcome(real: Server, emulated: Server, kind: str, name: str) -> dict[str, Any]:
    """Both servers hold the same object (what the emulator holds, server defaults aside)
    with the same managedFields; returns the emulator's."""
    theirs, ours = real.get(kind, name), emulated.get(kind, name)
    assert managed(ours) == managed(theirs), json.dumps(
        {"emulator": managed(ours), "kube-apiserver": managed(theirs)}, indent=1, default=str
    )
    for part in ("spec", "metadata"):
        mine = {k: v for k, v in ours[part].items() if k not in ("managedFields", "uid",
                "resourceVersion", "creationTimestamp", "generation", "annotations")}  # fmt: skip
        assert projection(theirs[part], mine) == mine, part
    return ours


def both(real: Server, emulated: Server, step: Any) -> tuple[int, Any]:
    """Run `step(server)` on both; the HTTP statuses (and a failure's message) agree."""
    (code, answer), (emulated_code, emulated_answer) = step(real), step(emulated)
    assert emulated_code == code, (emulated_answer, answer)
    if code >= 300:
        assert emulated_answer["message"] == answer["message"]
    return code, answer


def deployment(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": list(containers)},
            },
            **spec,
        },
    }


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def test_two_managers_share_containers_and_env_vars_item_by_item(
    kube: Kube, ns: str, emulator: Cluster
):
    real, emulated = real_server(kube, ns), emulated_server(emulator, ns)
    main = {"name": "main", "image": "registry.example/web:1",
            "ports": [{"name": "http", "containerPort": 8080}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}  # fmt: skip
    alpha = deployment(
        {**main, "env": env(A="1", SHARED="x")},
        replicas=0,
        paused=True,
    )
    alpha["spec"]["template"]["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    both(real, emulated, lambda s: s.apply("alpha", alpha))
    same_outcome(real, emulated, "deployments", "web")

    # beta adds an env var to alpha's container, co-owns SHARED (same value) and adds a sidecar
    side = {"name": "side", "image": "registry.example/side:1"}
    beta = deployment({"name": "main", "env": env(B="2", SHARED="x")}, side)
    both(real, emulated, lambda s: s.apply("beta", beta))
    ours = same_outcome(real, emulated, "deployments", "web")
    containers = ours["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", "side"]
    assert [e["name"] for e in containers[0]["env"]] == ["A", "B", "SHARED"]

    # beta changing alpha's image is a conflict on that one field of the item
    bumped = deployment({"name": "main", "image": "registry.example/web:2"})
    code, answer = both(real, emulated, lambda s: s.apply("beta", bumped))
    assert code == 409 and '[name="main"].image' in answer["message"]

    # gamma (an Update: a JSON patch) adds an env var to the container
    add = [{"op": "add", "path": "/spec/template/spec/containers/0/env/-",
            "value": {"name": "C", "value": "3"}}]  # fmt: skip
    both(real, emulated, lambda s: s.json_patch("gamma", "deployments", "web", add))
    same_outcome(real, emulated, "deployments", "web")

    # alpha stops sending A (only alpha's: removed) and SHARED (beta's too: kept)
    alpha_again = copy.deepcopy(alpha)
    alpha_again["spec"]["template"]["spec"]["containers"][0]["env"] = []
    both(real, emulated, lambda s: s.apply("alpha", alpha_again))
    ours = same_outcome(real, emulated, "deployments", "web")
    names = [e["name"] for e in ours["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names == ["B", "SHARED", "C"]

    # beta takes C's value by force, then stops sending the sidecar, SHARED and C: the
    # sidecar and SHARED are removed (nobody else owns them), C stays (gamma owns the item)
    beta_c = deployment({"name": "main", "env": env(B="2", SHARED="x", C="4")}, side)
    both(real, emulated, lambda s: s.apply("beta", beta_c, force=True))
    same_outcome(real, emulated, "deployments", "web")
    beta_less = deployment({"name": "main", "env": env(B="2")})
    both(real, emulated, lambda s: s.apply("beta", beta_less))
    ours = same_outcome(real, emulated, "deployments", "web")
    containers = ours["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main"]
    assert [(e["name"], e.get("value")) for e in containers[0]["env"]] == [("B", "2"), ("C", None)]

    # forced, beta takes alpha's image: alpha keeps the rest of its container
    both(
        real,
        emulated,
        lambda s: s.apply(
            "beta",
            deployment({"name": "main", "image": "registry.example/web:2", "env": env(B="2")}),
            force=True,
        ),
    )
    ours = same_outcome(real, emulated, "deployments", "web")
    assert ours["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/web:2"


def service(name: str, *ports: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": "web"}, "ports": list(ports)},
    }


def test_service_ports_are_keyed_by_port_and_protocol(kube: Kube, ns: str, emulator: Cluster):
    real, emulated = real_server(kube, ns), emulated_server(emulator, ns)
    http = {"name": "http", "port": 80, "targetPort": 8080}
    both(real, emulated, lambda s: s.apply("alpha", service("web", http)))
    dns = {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}
    both(real, emulated, lambda s: s.apply("beta", service("web", dns)))
    ours = same_outcome(real, emulated, "services", "web")
    assert [p["name"] for p in ours["spec"]["ports"]] == ["http", "dns"]
    # the same port over TCP is another item; its name is beta's (no conflict with alpha's)
    dns_tcp = {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353}
    both(real, emulated, lambda s: s.apply("beta", service("web", dns, dns_tcp)))
    same_outcome(real, emulated, "services", "web")
    # alpha renaming beta's port conflicts; alpha releasing its own removes it
    code, _ = both(real, emulated, lambda s: s.apply("alpha", service("web", http, {
        **dns, "name": "domain"})))  # fmt: skip
    assert code == 409
    both(real, emulated, lambda s: s.apply("alpha", service("web", dns)))
    ours = same_outcome(real, emulated, "services", "web")
    assert [p["name"] for p in ours["spec"]["ports"]] == ["dns", "dns-tcp"]
