"""`spec.model.lora`: the CRD's rules (DNS-safe, unique names; hf:// or pvc:// sources),
the operator's own validation in step with them, and what the pod gets: the runtime's
LoRA flags, an init container downloading the hf:// adapters at their revisions, the
pvc:// claims mounted read-only."""

from __future__ import annotations

import json

import pytest
from operator_testkit import isvc_object
from operator_validators import k8s_validate

from sluice.operator.builders import build_deployment
from sluice.operator.builders.model import LORA_DOWNLOAD_SCRIPT
from sluice.operator.parsing import SpecError

LORA = {
    "adapters": [
        {"name": "sql", "source": "hf://acme/sql-lora", "revision": "v3"},
        {"name": "chat", "source": "pvc://adapters/chat/v1"},
        {"name": "tools", "source": "hf://acme/tools-lora"},
    ],
    "maxAdapters": 2,
    "maxRank": 32,
}
MODEL = {"source": "hf://Qwen/Qwen2.5-0.5B-Instruct", "tokenSecretRef": {"name": "hf"}}


def test_adapters_become_flags_a_download_and_read_only_mounts(make_spec):
    isvc = make_spec(model={**MODEL, "lora": LORA})
    deployment = build_deployment(isvc)
    k8s_validate(deployment)
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    at = args.index("--enable-lora")
    assert args[at : at + 11] == [
        "--enable-lora", "--lora-modules", "sql=/lora/hf/sql", "chat=/lora/pvc/adapters/chat/v1",
        "tools=/lora/hf/tools", "--max-loras", "2", "--max-lora-rank", "32",
        "--max-cpu-loras", "3",
    ]  # fmt: skip
    download = next(c for c in pod["initContainers"] if c["name"] == "lora-download")
    assert download["command"] == ["python", "-c", LORA_DOWNLOAD_SCRIPT]
    env = {e["name"]: e for e in download["env"]}
    assert json.loads(env["SLUICE_LORA_ADAPTERS"]["value"]) == [
        {"repo": "acme/sql-lora", "revision": "v3", "dir": "/lora/hf/sql"},
        {"repo": "acme/tools-lora", "revision": "", "dir": "/lora/hf/tools"},
    ]
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/lora/hf"]["readOnly"] and mounts["/lora/pvc/adapters"]["readOnly"]
    claims = [v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert {"claimName": "adapters", "readOnly": True} in claims


def test_without_lora_the_pod_has_no_lora_flags_or_volumes(make_spec):
    pod = build_deployment(make_spec(model=MODEL))["spec"]["template"]["spec"]
    assert "--enable-lora" not in pod["containers"][0]["args"]
    assert not [v for v in pod["volumes"] if v["name"].startswith("lora")]


def test_changing_the_adapters_changes_the_pod_template(make_spec):
    """The adapters are downloaded at pod start: a new list rolls the pods."""
    one = build_deployment(make_spec(model={**MODEL, "lora": LORA}))["spec"]["template"]
    fewer = {**LORA, "adapters": LORA["adapters"][:1]}
    two = build_deployment(make_spec(model={**MODEL, "lora": fewer}))["spec"]["template"]
    assert one != two


@pytest.mark.parametrize(
    "adapters, message",
    [
        (
            [{"name": "a", "source": "hf://x/y"}, {"name": "a", "source": "hf://x/z"}],
            "listed twice",
        ),
        ([{"name": "Not_DNS", "source": "hf://x/y"}], "name"),
        ([{"name": "a", "source": "bundled://smollm2-135m"}], "no LoRA adapter is bundled"),
        ([{"name": "a", "source": "pvc://c/p", "revision": "v1"}], "only valid for hf://"),
    ],
)
def test_the_crd_and_the_operator_refuse_bad_adapter_lists(
    make_spec, crd_validator, adapters, message
):
    spec = {"model": {**MODEL, "lora": {"adapters": adapters}}}
    assert crd_validator.errors(isvc_object(**spec))
    with pytest.raises(SpecError, match=message):
        make_spec(**spec)


def test_duplicate_names_are_caught_by_cel_not_the_schema_alone(crd_validator):
    obj = isvc_object(model={**MODEL, "lora": {"adapters": [
        {"name": "a", "source": "hf://x/y"}, {"name": "a", "source": "pvc://c/p"}]}})  # fmt: skip
    assert crd_validator.schema_errors(obj) == []
    problems = crd_validator.errors(obj)
    assert any("unique" in p for p in problems), problems
    assert not any("failed to evaluate" in p for p in problems), problems


def test_a_valid_lora_spec_passes_the_crd(crd_validator):
    assert crd_validator.errors(isvc_object(model={**MODEL, "lora": LORA})) == []
