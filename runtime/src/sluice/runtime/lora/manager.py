"""`LoraManager`: the adapters of one model worker, and the LoRA layers on its model.

Three tiers, as vLLM has them:

- registered: every adapter the server knows (id -> name, folder). Ids come from the API
  server, one per load, never reused, so a cache key or a slot never confuses an adapter
  with an earlier one of the same name.
- host cache: validated weights of at most `--max-cpu-loras` adapters, least recently used
  evicted (and read again from the folder when a batch needs it);
- device slots: `--max-loras` stacked buffers per projection piece, `A [S, R, in]` and
  `B [S, out, R]` (this rank's shard), which the batched kernels read. A batch holds at
  most `--max-loras` adapters (the scheduler's rule), so its adapters always fit; a slot
  not used by the batch is reused least recently used first.

`attach` wraps each fused projection the model's `LoraLayout` names (`lora.layout`, derived
from its architecture's weight rules: `self_attn.qkv_proj` holds q/k/v, `mlp.gate_up_proj`
gate/up where a layer has a dense MLP; whatever module sits there: plain, w8a8 or bf16) in
a `LoraLinear` that adds each piece's term. With tensor parallelism (Megatron layout) a
column-parallel piece keeps the rows of `B` of this rank's output share and all of `A`; a
row-parallel one (o, down) keeps the columns of `A` of its input share and all of `B`, and
the all-reduce after the layer sums the ranks' partial terms, as it does the base weight's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sluice.runtime.lora.adapter import LoraWeights, load_adapter
from sluice.runtime.lora.layout import LoraLayout
from sluice.runtime.lora.ops import Segments, build_segments, lora_torch
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.sharding import TensorRead

logger = logging.getLogger("sluice.lora")

BASE = 0  # the lora id of the base model


@dataclass(frozen=True)
class LoraConfig:
    max_loras: int = 1
    max_rank: int = 16
    max_cpu_loras: int = 1


@dataclass(frozen=True)
class Piece:
    """One HF projection inside a fused one: output columns [start, start + size)."""

    module: str
    read: TensorRead  # what this rank keeps of the adapter: the base weight's TP split
    start: int
    size: int
    fan_in: int
    a: torch.Tensor  # [S, R, fan_in]
    b: torch.Tensor  # [S, size, R]


def _padded_rank(max_rank: int) -> int:
    r = 16
    while r < max_rank:
        r *= 2
    return r


class LoraLinear(nn.Module):
    """A projection plus the LoRA terms of the batch's adapters."""

    def __init__(self, base: nn.Module, pieces: list[Piece], manager: LoraManager) -> None:
        super().__init__()
        self.base = base
        self.pieces = pieces
        self._manager = [manager]  # a list: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        manager = self._manager[0]
        seg = manager.segments
        if seg is None or not seg.active:
            return y
        x2 = x.reshape(-1, x.shape[-1])
        y2 = y.view(-1, y.shape[-1])
        for p in self.pieces:
            manager.apply(y2[:, p.start : p.start + p.size], x2, p.a, p.b, seg)
        return y


class LoraManager:
    def __init__(
        self,
        config: LoraConfig,
        model: CausalLM,
        layout: LoraLayout,
        device: torch.device | str,
        dtype: torch.dtype,
        base_names: set[str] | None = None,
    ) -> None:
        if not layout.modules:
            raise ValueError(f"--enable-lora: {layout.architecture} has no projection LoRA "
                             "can adapt")  # fmt: skip
        self.config = config
        self.model = model
        self.layout = layout
        self.device = torch.device(device)
        self.dtype = dtype
        self.base_names = base_names
        self.rank_dim = _padded_rank(config.max_rank)
        self.registered: dict[int, tuple[str, str]] = {}  # id -> (name, folder)
        self.host: OrderedDict[int, LoraWeights] = OrderedDict()
        slots = config.max_loras
        self.slot_ids: list[int | None] = [None] * slots
        self.slot_rank: list[int] = [0] * slots
        self.slot_used: list[int] = [0] * slots
        self.scaling = [1.0] * slots
        self.scaling_t = torch.ones(slots, dtype=torch.float32, device=self.device)
        self._tick = 0
        self._lock = threading.Lock()
        self.segments: Segments | None = None
        self.layers: list[dict[str, Piece]] = []  # per layer: module name -> piece
        self.loads_total = 0
        self.use_triton = self.device.type == "cuda"
        self._attach()

    # ---- the model ----------------------------------------------------------------------
    def _attach(self) -> None:
        """Wrap each fused module the layout names in a `LoraLinear` with its pieces."""
        s, r = self.config.max_loras, self.rank_dim
        for layer, targets in zip(self.model.layers, self.layout.layers, strict=True):
            pieces: dict[str, Piece] = {}
            by_module: dict[str, list[Piece]] = {}
            for target in targets.values():
                a = torch.zeros(s, r, target.fan_in, dtype=self.dtype, device=self.device)
                b = torch.zeros(s, target.size, r, dtype=self.dtype, device=self.device)
                piece = Piece(target.module, target.read, target.start, target.size,
                              target.fan_in, a, b)  # fmt: skip
                pieces[target.module] = piece
                by_module.setdefault(target.fused, []).append(piece)
            for fused, made in by_module.items():
                parent_name, _, attr = fused.rpartition(".")
                parent = layer.get_submodule(parent_name)
                setattr(parent, attr, LoraLinear(getattr(parent, attr), made, self))
            self.layers.append(pieces)

    def apply(
        self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, seg: Segments
    ) -> None:
        if self.use_triton:
            from sluice.runtime.lora.triton_sgmv import lora_triton

            lora_triton(y, x, a, b, self.scaling_t, seg)
        else:
            lora_torch(y, x, a, b, self.scaling, seg)

    # ---- registry -----------------------------------------------------------------------
    @property
    def names(self) -> dict[int, str]:
        return {i: name for i, (name, _) in self.registered.items()}

    def register(self, lora_id: int, name: str, path: str) -> float:
        """Read and validate the adapter (raises `LoraAdapterError`); seconds it took."""
        began = time.perf_counter()
        weights = self._read(name, path)
        with self._lock:
            self.registered[lora_id] = (name, path)
            self._cache(lora_id, weights)
        seconds = time.perf_counter() - began
        logger.info("lora adapter loaded name=%s id=%d rank=%d modules=%s path=%s seconds=%.3f",
                    name, lora_id, weights.rank, ",".join(sorted(weights.modules)), path, seconds)  # fmt: skip
        return seconds

    def unregister(self, lora_id: int) -> None:
        with self._lock:
            name, _ = self.registered.pop(lora_id, ("?", ""))
            self.host.pop(lora_id, None)
            for slot, held in enumerate(self.slot_ids):
                if held == lora_id:
                    self.slot_ids[slot] = None
        logger.info("lora adapter unloaded name=%s id=%d", name, lora_id)

    def _read(self, name: str, path: str) -> LoraWeights:
        self.loads_total += 1
        return load_adapter(name, path, self.layout, self.config.max_rank, self.base_names)

    def _cache(self, lora_id: int, weights: LoraWeights) -> None:
        self.host[lora_id] = weights
        self.host.move_to_end(lora_id)
        while len(self.host) > self.config.max_cpu_loras:
            evicted, _ = self.host.popitem(last=False)
            logger.info("lora host cache full: evicted id=%d (read again when needed)", evicted)

    def _weights(self, lora_id: int) -> LoraWeights:
        if lora_id not in self.host:
            name, path = self.registered[lora_id]
            self._cache(lora_id, self._read(name, path))
        self.host.move_to_end(lora_id)
        return self.host[lora_id]

    # ---- one batch ----------------------------------------------------------------------
    def prepare(self, row_loras: Sequence[tuple[int, int]]) -> None:
        """Place the batch's adapters in slots and describe its tokens. `row_loras`: per
        request row in batch order, (tokens, lora id; 0 for the base model)."""
        if not any(lora for _, lora in row_loras):
            self.segments = None
            return
        with self._lock:
            self._tick += 1
            wanted = list(dict.fromkeys(lora for _, lora in row_loras if lora != BASE))
            if len(wanted) > len(self.slot_ids):
                raise RuntimeError(
                    f"a batch holds {len(wanted)} adapters; --max-loras is {len(self.slot_ids)}"
                )
            slot_of = {held: s for s, held in enumerate(self.slot_ids) if held is not None}
            for lora in wanted:
                if lora not in self.registered:
                    raise RuntimeError(f"LoRA adapter id {lora} is not loaded")
                if lora not in slot_of:
                    slot = self._free_slot(set(wanted))
                    self._fill_slot(slot, lora)
                    slot_of[lora] = slot
                self.slot_used[slot_of[lora]] = self._tick
            token_slots = [(n, slot_of[lora] if lora != BASE else -1) for n, lora in row_loras]
        self.segments = build_segments(token_slots, self.slot_rank, self.device)

    def _free_slot(self, keep: set[int]) -> int:
        candidates = [s for s, held in enumerate(self.slot_ids) if held is None or held not in keep]
        empty = [s for s in candidates if self.slot_ids[s] is None]
        return empty[0] if empty else min(candidates, key=lambda s: self.slot_used[s])

    def _fill_slot(self, slot: int, lora_id: int) -> None:
        w = self._weights(lora_id)
        rank = w.rank
        for layer_id, pieces in enumerate(self.layers):
            for module, p in pieces.items():
                p.a[slot].zero_()
                p.b[slot].zero_()
                key = (layer_id, module)
                if key not in w.a:
                    continue
                a, b, read = w.a[key], w.b[key], p.read
                if read.rows is not None:  # column-parallel: this rank's output rows of B
                    b = b[read.rows[0] : read.rows[1]]
                if read.cols is not None:  # row-parallel: this rank's input columns of A
                    a = a[:, read.cols[0] : read.cols[1]]
                p.a[slot, :rank].copy_(a)
                p.b[slot, :, :rank].copy_(b)
        self.slot_ids[slot] = lora_id
        self.slot_rank[slot] = rank
        self.scaling[slot] = w.scaling
        self.scaling_t[slot] = w.scaling


def base_model_names(
    model: str, model_path: str, served_model_name: str, bundled: tuple[str, ...] = ()
) -> set[str]:
    """What an adapter's `base_model_name_or_path` may say for this server's model: the
    `--model` value, the folder's name, the served name (lower-case; the last path part of
    an adapter's claim is compared too)."""
    names = {
        model,
        model.rstrip("/").rsplit("/", 1)[-1],
        str(model_path).rstrip("/").rsplit("/", 1)[-1],
    }
    names |= {served_model_name, *bundled, *hub_id_names(str(model_path))}
    return {n.lower().removesuffix(".gguf") for n in names if n}


def hub_id_names(path: str) -> set[str]:
    """The hub id an HF cache folder stands for (`.../models--Org--Name/snapshots/<hash>`
    is `Org/Name`), and its name alone."""
    for part in reversed(path.rstrip("/").split("/")):
        if part.startswith("models--"):
            hub_id = part.removeprefix("models--").replace("--", "/")
            return {hub_id, hub_id.rsplit("/", 1)[-1]}
    return set()
