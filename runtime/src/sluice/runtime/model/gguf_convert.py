"""GGUF files converted once to a cached safetensors folder: dequantised by transformers'
own GGUF reader (Mixtral, which it does not map, by `gguf_mixtral`), with the metadata that
reader drops read from the file (`gguf_config_fixes`). The folder appears by one
`os.rename`, so a crash or a concurrent process never sees half a conversion, and a file
lock makes concurrent processes convert once between them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from sluice.runtime.model.gguf_mixtral import expert_count, mixtral_config, mixtral_tensors

logger = logging.getLogger(__name__)

# bump when the conversion changes, so caches written by an older one are not reused
GGUF_CONVERTER_VERSION = 2  # 2: the metadata transformers drops (gguf_config_fixes)


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
    with file_lock(cache_dir / f".{target.name}.lock"):
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
def file_lock(path: Path) -> Iterator[None]:
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
