"""Model sources → the `--model` argument, volumes, mounts and download init container.

- `bundled://smollm2-135m`, `bundled://gemma3-270m`: the weights ship in the image;
  `--model smollm2-135m` / `--model gemma3-270m`.
- `hf://org/name`: an init container (same image, which has `huggingface_hub`) downloads
  the snapshot before the runtime starts, with HF_TOKEN from `spec.model.tokenSecretRef`
  and the user's `spec.env` (proxies, HF_ENDPOINT, HF_HUB_ENABLE_HF_TRANSFER). Only the
  files matching `spec.model.files` are fetched (all but original checkpoints without it).
  - Without a cache: into an emptyDir of the pod (`storageSize` bounds it and is
    requested as ephemeral storage); the runtime reads it from there, read-only.
  - With `spec.model.cache.claimName`: a ReadWriteMany claim is the download's Hub cache
    (HF_HOME), shared by every replica: the first downloads, the next ones find the files
    there and only check the revision. The init container links the snapshot folder to
    /models/hf, and the runtime mounts the claim read-only to follow the link.
  A model that is one GGUF file is loaded as that file: name it in `files`.
- `pvc://claim/path`: the claim is mounted read-only; `--model` points inside it.

`spec.model.lora` adds LoRA adapters the same way: hf:// adapters are downloaded (pinned at
their `revision`) by one more init container into an emptyDir, LORA_DIR/hf/NAME; a pvc://
adapter's claim is mounted read-only under LORA_DIR/pvc/CLAIM; the runtime gets
`--enable-lora --lora-modules NAME=PATH ...`. The adapters are part of the pod template:
changing the list rolls the pods (each new pod downloads the new list before it starts).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec, LoraAdapterSpec
from .common import container_security_context, secret_env

# Arguments come from the environment, never from string formatting, so a repo name or a
# revision cannot inject code. Original checkpoints (*.pth, original/) are skipped unless
# `files` asks for them: the runtime loads safetensors or GGUF.
DOWNLOAD_SCRIPT = """\
import json
import os
from huggingface_hub import snapshot_download
files = json.loads(os.environ.get("SLUICE_MODEL_FILES") or "[]")
target = os.environ["SLUICE_MODEL_DIR"]
shared = os.environ.get("SLUICE_MODEL_CACHE") == "1"
path = snapshot_download(
    repo_id=os.environ["SLUICE_MODEL_REPO"],
    revision=os.environ.get("SLUICE_MODEL_REVISION") or None,
    local_dir=None if shared else target,
    allow_patterns=files or None,
    ignore_patterns=None if files else ["*.pth", "*.pt", "original/*"],
)
if shared:
    if os.path.islink(target):  # a restarted init container: the emptyDir outlives it
        os.remove(target)
    os.symlink(path, target, target_is_directory=True)
"""


LORA_DOWNLOAD_SCRIPT = """\
import json
import os
from huggingface_hub import snapshot_download
for adapter in json.loads(os.environ["SLUICE_LORA_ADAPTERS"]):
    snapshot_download(
        repo_id=adapter["repo"],
        revision=adapter.get("revision") or None,
        local_dir=adapter["dir"],
        allow_patterns=["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"],
    )
"""


@dataclass(frozen=True)
class ModelMount:
    """What the pod needs so that `--model model_argument` resolves."""

    model_argument: str
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    init_containers: tuple[dict[str, Any], ...] = ()


def model_mount(isvc: InferenceServiceSpec, resources: dict[str, Any]) -> ModelMount:
    """`resources` are the CPU/memory requirements the download containers share."""
    mount = _base_mount(isvc, resources)
    lora = isvc.model.lora
    if lora is None or not lora.adapters:
        return mount
    volumes, mounts, init = list(mount.volumes), list(mount.mounts), list(mount.init_containers)
    hf = [a for a in lora.adapters if a.source.scheme == "hf"]
    if hf:
        volumes.append({"name": c.VOLUME_LORA, "emptyDir": {}})
        mounts.append({"name": c.VOLUME_LORA, "mountPath": f"{c.LORA_DIR}/hf", "readOnly": True})
        init.append(_lora_download_container(isvc, hf, resources))
    claims = list(dict.fromkeys(a.source.claim for a in lora.adapters if a.source.scheme == "pvc"))
    for i, claim in enumerate(claims):
        name = f"{c.VOLUME_LORA}-pvc-{i}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"{c.LORA_DIR}/pvc/{claim}", "readOnly": True})
    return dataclasses.replace(
        mount, volumes=tuple(volumes), mounts=tuple(mounts), init_containers=tuple(init)
    )


def lora_path(adapter: LoraAdapterSpec) -> str:
    """Where the runtime finds an adapter's folder in the pod."""
    if adapter.source.scheme == "hf":
        return f"{c.LORA_DIR}/hf/{adapter.name}"
    path = adapter.source.path
    return f"{c.LORA_DIR}/pvc/{adapter.source.claim}" + (f"/{path}" if path else "")


def _lora_download_container(
    isvc: InferenceServiceSpec, adapters: list[LoraAdapterSpec], resources: dict[str, Any]
) -> dict[str, Any]:
    wanted = [{"repo": a.source.repo, "revision": a.revision or "", "dir": lora_path(a)} for a in adapters]
    env: list[dict[str, Any]] = [
        {"name": c.ENV_LORA_ADAPTERS, "value": json.dumps(wanted)},
        {"name": c.ENV_HF_HOME, "value": f"{c.TMP_DIR}/huggingface"},
    ]
    if isvc.model.token_secret:
        ref = isvc.model.token_secret
        env.append(secret_env(c.ENV_HF_TOKEN, ref.name, ref.key))
    env += [copy.deepcopy(dict(item)) for item in isvc.env]
    container: dict[str, Any] = {
        "name": c.LORA_DOWNLOAD_CONTAINER_NAME,
        "image": isvc.image,
        "command": ["python", "-c", LORA_DOWNLOAD_SCRIPT],
        "env": env,
        "volumeMounts": [
            {"name": c.VOLUME_LORA, "mountPath": f"{c.LORA_DIR}/hf"},
            {"name": c.VOLUME_TMP, "mountPath": c.TMP_DIR},
        ],
        "securityContext": container_security_context(),
    }
    if resources:
        container["resources"] = resources
    return container


def _base_mount(isvc: InferenceServiceSpec, resources: dict[str, Any]) -> ModelMount:
    source = isvc.model.source
    if source.scheme == "bundled":
        return ModelMount(model_argument=source.path or rc.BUNDLED_MODEL_NAME)
    if source.scheme == "pvc":
        mount_path = c.PVC_MODEL_DIR
        return ModelMount(
            model_argument=f"{mount_path}/{source.path}" if source.path else mount_path,
            volumes=(
                {
                    "name": c.VOLUME_MODEL,
                    "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True},
                },
            ),
            mounts=({"name": c.VOLUME_MODEL, "mountPath": mount_path, "readOnly": True},),
        )
    single = isvc.model.single_file
    argument = f"{c.HF_MODEL_DIR}/{single}" if single else c.HF_MODEL_DIR
    empty_dir: dict[str, Any] = {}
    if isvc.model.storage_size and not isvc.model.cache_claim:
        empty_dir["sizeLimit"] = isvc.model.storage_size
    volumes: list[dict[str, Any]] = [{"name": c.VOLUME_MODEL, "emptyDir": empty_dir}]
    mounts: list[dict[str, Any]] = [
        {"name": c.VOLUME_MODEL, "mountPath": c.MODELS_DIR, "readOnly": True}
    ]
    if isvc.model.cache_claim:
        volumes.append(
            {
                "name": c.VOLUME_MODEL_CACHE,
                "persistentVolumeClaim": {"claimName": isvc.model.cache_claim},
            }
        )
        mounts.append(
            {"name": c.VOLUME_MODEL_CACHE, "mountPath": c.SHARED_CACHE_DIR, "readOnly": True}
        )
    return ModelMount(
        model_argument=argument,
        volumes=tuple(volumes),
        mounts=tuple(mounts),
        init_containers=(_download_container(isvc, resources),),
    )


def _download_container(isvc: InferenceServiceSpec, resources: dict[str, Any]) -> dict[str, Any]:
    assert isvc.model.source.repo is not None
    shared = isvc.model.cache_claim is not None
    env: list[dict[str, Any]] = [
        {"name": c.ENV_MODEL_REPO, "value": isvc.model.source.repo},
        {"name": c.ENV_MODEL_DIR, "value": c.HF_MODEL_DIR},
        {
            "name": c.ENV_HF_HOME,
            "value": c.SHARED_CACHE_DIR if shared else f"{c.TMP_DIR}/huggingface",
        },
    ]
    if isvc.model.revision:
        env.append({"name": c.ENV_MODEL_REVISION, "value": isvc.model.revision})
    if isvc.model.files:
        env.append({"name": c.ENV_MODEL_FILES, "value": json.dumps(list(isvc.model.files))})
    if shared:
        env.append({"name": c.ENV_MODEL_CACHE, "value": "1"})
    if isvc.model.token_secret:
        ref = isvc.model.token_secret
        env.append(secret_env(c.ENV_HF_TOKEN, ref.name, ref.key))
    env += [copy.deepcopy(dict(item)) for item in isvc.env]
    mounts: list[dict[str, Any]] = [
        {"name": c.VOLUME_MODEL, "mountPath": c.MODELS_DIR},
        {"name": c.VOLUME_TMP, "mountPath": c.TMP_DIR},
    ]
    if shared:
        mounts.append({"name": c.VOLUME_MODEL_CACHE, "mountPath": c.SHARED_CACHE_DIR})
    container: dict[str, Any] = {
        "name": c.DOWNLOAD_CONTAINER_NAME,
        "image": isvc.image,
        "command": ["python", "-c", DOWNLOAD_SCRIPT],
        "env": env,
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    if resources:
        container["resources"] = resources
    return container
