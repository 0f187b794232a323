"""hf:// models pinned to the commit their revision resolved to (revisions.py), end to end:
the operator under Kopf, the emulated API server, and a stand-in for the Hub's revision
API (fake_hub.py)."""

from __future__ import annotations

import base64
import json

from kopf_testkit import DEPLOYMENT, condition, create, get, patch_spec, status
from operator_cluster import wait_for

from sluice.operator.kube import INFERENCESERVICES

REPO = "acme/chat-7b"
MODEL = {"source": f"hf://{REPO}", "storageSize": "20Gi"}


def download_revision(cluster, ns: str, name: str = "chat") -> str | None:
    deployment = get(cluster, DEPLOYMENT, ns, name)
    if deployment is None:
        return None
    [init] = deployment["spec"]["template"]["spec"]["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    return env.get("SLUICE_MODEL_REVISION")


def test_a_branch_is_pinned_to_its_commit_and_stays_pinned_until_the_spec_asks(
    cluster, ns, hub
):
    first = hub.sha(REPO)
    create(cluster, ns, "chat", model=MODEL)
    wait_for(lambda: download_revision(cluster, ns) == first, what="the pinned download")
    pin = wait_for(lambda: status(cluster, ns, "chat").get("model"), what="status.model")
    assert pin == {"requested": f"{REPO}@main", "revision": first}

    # the branch moves on; a change of anything else rolls pods on the same commit
    moved = hub.push(REPO)
    asked = hub.resolved(REPO)
    patch_spec(cluster, ns, "chat", {"replicas": 3})
    wait_for(
        lambda: get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 3, what="3 replicas"
    )
    wait_for(lambda: status(cluster, ns, "chat").get("observedGeneration") == 2, what="status")
    assert download_revision(cluster, ns) == first
    assert hub.resolved(REPO) == asked  # not even asked again

    # asked on purpose: the annotation moves it to the branch's head
    cluster.patch(
        INFERENCESERVICES.api_version, INFERENCESERVICES.plural, ns, "chat",
        {"metadata": {"annotations": {"sluice.dev/refresh-revision": "1"}}},
    )  # fmt: skip
    wait_for(lambda: download_revision(cluster, ns) == moved, what="the new head")
    wait_for(
        lambda: status(cluster, ns, "chat")["model"]["requested"] == f"{REPO}@main#1",
        what="the refreshed pin in the status",
    )

    # a new revision in the spec resolves that one
    patch_spec(cluster, ns, "chat", {"model": {**MODEL, "revision": "v2"}})
    wait_for(lambda: download_revision(cluster, ns) == hub.sha(REPO, "v2"), what="the tag")


def test_a_commit_is_used_as_it_is_without_asking_the_hub(cluster, ns, hub):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = "acme/by-commit"
    create(cluster, ns, "chat", model={**MODEL, "source": f"hf://{repo}", "revision": commit})
    wait_for(lambda: download_revision(cluster, ns) == commit, what="the commit")
    assert hub.resolved(repo) == 0


def test_a_gated_model_is_resolved_with_the_token_secret(cluster, ns, hub):
    repo = "acme/gated"
    hub.gate(repo, "hf_secret")
    cluster.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": ns},
         "data": {"token": base64.b64encode(b"hf_secret").decode()}}
    )  # fmt: skip
    create(cluster, ns, "gated", model={**MODEL, "source": f"hf://{repo}",
                                        "tokenSecretRef": {"name": "hf", "key": "token"}})  # fmt: skip
    wait_for(lambda: download_revision(cluster, ns, "gated") == hub.sha(repo), what="the pin")


def test_an_unresolvable_revision_is_reported_and_nothing_unpinned_is_deployed(cluster, ns, hub):
    repo = "acme/private"
    hub.gate(repo, "not-given")
    create(cluster, ns, "chat", model={**MODEL, "source": f"hf://{repo}"})
    ready = wait_for(
        lambda: (cond := condition(cluster, ns, "chat", "Ready")).get("reason")
        == "RevisionUnresolved" and cond,
        what="Ready=False RevisionUnresolved",
    )
    assert "gated or private" in ready["message"] and "tokenSecretRef" in ready["message"]
    assert status(cluster, ns, "chat")["phase"] == "Failed"
    assert get(cluster, DEPLOYMENT, ns, "chat") is None
    create(cluster, ns, "gone", model={**MODEL, "source": "hf://missing/model"})
    wait_for(
        lambda: "no such repository" in condition(cluster, ns, "gone", "Ready").get("message", ""),
        what="the 404 reported",
    )


def test_hf_lora_adapters_are_pinned_too(cluster, ns, hub):
    adapter_repo = "acme/sql-lora"
    create(cluster, ns, "chat", model={
        "source": "bundled://smollm2-135m",
        "lora": {"adapters": [{"name": "sql", "source": f"hf://{adapter_repo}"},
                              {"name": "tagged", "source": f"hf://{adapter_repo}", "revision": "v1"}]},
    })  # fmt: skip

    def lora_revisions() -> dict[str, str] | None:
        deployment = get(cluster, DEPLOYMENT, ns, "chat")
        if deployment is None:
            return None
        [init] = deployment["spec"]["template"]["spec"]["initContainers"]
        env = {e["name"]: e.get("value") for e in init["env"]}
        adapters = json.loads(env["SLUICE_LORA_ADAPTERS"])
        return {a["dir"].rsplit("/", 1)[-1]: a["revision"] for a in adapters}

    first = {"sql": hub.sha(adapter_repo), "tagged": hub.sha(adapter_repo, "v1")}
    wait_for(lambda: lora_revisions() == first, what="the adapters pinned")
    pins = wait_for(lambda: status(cluster, ns, "chat").get("model"), what="status.model")
    assert pins == {"adapters": [
        {"name": "sql", "requested": f"{adapter_repo}@main", "revision": first["sql"]},
        {"name": "tagged", "requested": f"{adapter_repo}@v1", "revision": first["tagged"]},
    ]}  # fmt: skip
    hub.push(adapter_repo)
    patch_spec(cluster, ns, "chat", {"replicas": 2})
    wait_for(lambda: status(cluster, ns, "chat").get("observedGeneration") == 2, what="status")
    assert lora_revisions() == first  # the branch moved; the pods keep the pinned commit
