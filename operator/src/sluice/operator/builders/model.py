"""Model sources → the `--model` argument, volumes, mounts and download init container.

- `bundled://smollm2-135m`: the weights ship in the image; `--model smollm2-135m`.
- `hf://org/name`: an init container (same image, which has `huggingface_hub`) downloads
  the snapshot into an emptyDir, with HF_TOKEN from `spec.model.tokenSecretRef`; the
  runtime reads it from there, read-only.
- `pvc://claim/path`: the claim is mounted read-only; `--model` points inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import container_security_context, secret_env

# Arguments come from the environment, never from string formatting, so a repo name or a
# revision cannot inject code. Original checkpoints (*.pth, original/) are skipped: the
# runtime loads safetensors or GGUF.
DOWNLOAD_SCRIPT = """\
import os
from huggingface_hub import snapshot_download
snapshot_download(
    repo_id=os.environ["SLUICE_MODEL_REPO"],
    revision=os.environ.get("SLUICE_MODEL_REVISION") or None,
    local_dir=os.environ["SLUICE_MODEL_DIR"],
    ignore_patterns=["*.pth", "*.pt", "original/*"],
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
    """`resources` are the CPU/memory requirements the download container shares."""
    source = isvc.model.source
    if source.scheme == "bundled":
        return ModelMount(model_argument=rc.BUNDLED_MODEL_NAME)
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
    empty_dir: dict[str, Any] = {}
    if isvc.model.storage_size:
        empty_dir["sizeLimit"] = isvc.model.storage_size
    return ModelMount(
        model_argument=c.HF_MODEL_DIR,
        volumes=({"name": c.VOLUME_MODEL, "emptyDir": empty_dir},),
        mounts=({"name": c.VOLUME_MODEL, "mountPath": c.MODELS_DIR, "readOnly": True},),
        init_containers=(_download_container(isvc, resources),),
    )


def _download_container(isvc: InferenceServiceSpec, resources: dict[str, Any]) -> dict[str, Any]:
    assert isvc.model.source.repo is not None
    env: list[dict[str, Any]] = [
        {"name": c.ENV_MODEL_REPO, "value": isvc.model.source.repo},
        {"name": c.ENV_MODEL_DIR, "value": c.HF_MODEL_DIR},
        {"name": c.ENV_HF_HOME, "value": f"{c.TMP_DIR}/huggingface"},
    ]
    if isvc.model.revision:
        env.append({"name": c.ENV_MODEL_REVISION, "value": isvc.model.revision})
    if isvc.model.token_secret:
        ref = isvc.model.token_secret
        env.append(secret_env(c.ENV_HF_TOKEN, ref.name, ref.key))
    container: dict[str, Any] = {
        "name": c.DOWNLOAD_CONTAINER_NAME,
        "image": isvc.image,
        "command": ["python", "-c", DOWNLOAD_SCRIPT],
        "env": env,
        "volumeMounts": [
            {"name": c.VOLUME_MODEL, "mountPath": c.MODELS_DIR},
            {"name": c.VOLUME_TMP, "mountPath": c.TMP_DIR},
        ],
        "securityContext": container_security_context(),
    }
    if resources:
        container["resources"] = resources
    return container
