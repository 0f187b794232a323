"""A decoder-only causal LM over a paged KV cache, for every architecture in the registry.

The embedding, the final norm and the LM head are common; the decoder layers are the
architecture's (`model.registry.Architecture.decoder_layer`), and its weight rules map
Hugging Face tensor names onto the (fused) parameters. q/k/v and gate/up are fused into one
matmul each; the rules say which rows of the fused parameter each checkpoint tensor fills.

With tensor parallelism every layer is built with its rank's shard shapes
(`model.sharding`); the decoder layers all-reduce their attention and MLP outputs (the
row-parallel o and down projections), the embedding and the LM head are vocab-parallel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.forward import ForwardBatch
from sluice.runtime.model.architecture import Architecture, WeightRule
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.layers import Linear, RMSNorm
from sluice.runtime.model.parallel_layers import embed, gather_logits
from sluice.runtime.model.rotary import RotaryEmbedding
from sluice.runtime.model.sharding import ModelShard

_IGNORED_WEIGHTS = re.compile(r"rotary_emb\.inv_freq$")
_WHOLE_PIECES = ("", "o", "down", "expert_down")  # a row split cuts columns, not rows


class CausalLM(nn.Module):
    """Token ids in, next-token logits out; K/V live in `batch.kv`, written by the backend.

    `config` is the whole model's; `local_config` the shapes this rank builds (the same
    without tensor parallelism). `architecture` defaults to the registry's for `config`."""

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallelGroup = SINGLE_RANK,
        *,
        architecture: Architecture,
    ) -> None:
        super().__init__()
        self.architecture = architecture
        self.tp = tp
        self.shard = ModelShard(config, tp.rank, tp.size, self.architecture.weight_rules)
        self.config = config
        self.local_config = local = self.shard.local_config()
        self.attn_backend = attn_backend
        self.embed_tokens = nn.Parameter(
            torch.empty(local.vocab_size, local.hidden_size, device=device, dtype=dtype),
            requires_grad=False,
        )
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, device
        )
        make_layer = self.architecture.decoder_layer
        self.layers = nn.ModuleList(
            make_layer(local, i, device, dtype, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head = Linear(local.hidden_size, local.vocab_size, False, device, dtype)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens

    @torch.no_grad()  # not inference_mode: callers may edit the logits in place afterwards
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits `[batch_size, vocab]` at each request's last new token.

        With `batch.return_all_logits`, `[num_tokens, vocab]` at every new token; with
        `batch.extra_logit_indices`, those tokens' rows follow the last tokens' ones. Calls the
        backend's `init_forward_metadata` first, so callers only build the batch.
        """
        self.attn_backend.init_forward_metadata(batch)
        hidden = embed(batch.input_ids, self.embed_tokens, self.shard.vocab_start, self.tp)
        cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, batch, self.attn_backend)
        return self.logits(hidden, batch)

    def logits(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """The last layer's hidden states to fp32 logits at the rows `forward` returns (the
        final norm and the LM head run on those rows only). The LM head sums and writes fp32
        whatever the model dtype: bf16 logits near 25 are 0.125 apart, so a near-tie became
        an exact tie that the lower token id won."""
        if not batch.return_all_logits:
            wanted = batch.last_token_indices
            if batch.extra_logit_indices is not None:
                wanted = torch.cat([wanted, batch.extra_logit_indices])
            hidden = hidden[wanted]
        rows = hidden.shape[0]
        if batch.row_multiple > 1:  # deterministic mode: a batch-invariant row count
            padded = max(batch.row_multiple, -(-rows // batch.row_multiple) * batch.row_multiple)
            hidden = torch.cat([hidden, hidden.new_zeros(padded - rows, hidden.shape[1])])
        logits = self.lm_head.forward_fp32(self.norm(hidden))
        return gather_logits(logits, self.config.vocab_size, self.tp)[:rows]

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
    ) -> None:
        """Copy Hugging Face-named tensors into the (fused) parameters, converting dtype/device.

        Raises `ValueError` naming any unexpected tensor, or any expected one that never came.
        With tensor parallelism the tensors are this rank's shards (`ModelShard.read`).
        `lm_head.weight` is optional: without it (or with `tie_word_embeddings`) the output
        projection shares the embedding matrix.
        """
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        seen: set[str] = set()
        lm_head: torch.Tensor | None = None
        for name, tensor in items:
            if _IGNORED_WEIGHTS.search(name):
                continue
            if name == "lm_head.weight":
                lm_head = tensor
                continue
            rule, param, expert = self._resolve(name)
            seen.add(name)
            self._copy(rule, param if expert is None else param[expert], tensor, name)
        missing = sorted(set(self.expected_weight_names()) - seen)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint lacks {len(missing)} weights: {shown}")
        if self.config.tie_word_embeddings or lm_head is None:
            self.lm_head.weight = self.embed_tokens
        else:
            if self.lm_head.weight is self.embed_tokens:  # config said tied, checkpoint disagrees
                self.lm_head.weight = nn.Parameter(
                    torch.empty_like(self.embed_tokens), requires_grad=False
                )
            _copy_whole(self.lm_head.weight, lm_head, "lm_head.weight")

    def expected_weight_names(self) -> list[str]:
        """Every HF tensor name this model needs (`lm_head.weight` excluded: it may be tied)."""
        names: list[str] = []
        for rule in self.architecture.weight_rules:
            layers = range(self.config.num_hidden_layers) if "{layer}" in rule.target else [None]
            for layer in layers:
                param = self._parameter(rule.target_name(layer))
                if param is None:
                    continue
                if rule.per_expert:
                    names += [rule.hf_name(layer, e) for e in range(param.shape[0])]
                else:
                    names.append(rule.hf_name(layer))
        return names

    def _resolve(self, name: str) -> tuple[WeightRule, torch.Tensor, int | None]:
        """The rule `name` falls under, the parameter it fills and its expert (or None)."""
        for rule in self.architecture.weight_rules:
            match = rule.pattern.fullmatch(name)
            if match is None:
                continue
            groups = match.groupdict()
            layer = int(groups["layer"]) if "layer" in groups else None
            param = self._parameter(rule.target_name(layer))
            if param is None:
                continue  # inactive here: maybe another rule takes it
            expert = int(groups["expert"]) if "expert" in groups else None
            if expert is not None and expert >= param.shape[0]:
                break
            return rule, param, expert
        raise ValueError(f"unexpected weight {name!r} for {self.architecture.names[0]}")

    def _parameter(self, path: str) -> torch.Tensor | None:
        """The parameter at dotted `path`, or None where the model has none."""
        owner: object = self
        for part in path.split("."):
            owner = getattr(owner, part, None)
            if owner is None:
                return None
        return owner if isinstance(owner, torch.Tensor) else None

    def _copy(self, rule: WeightRule, dest: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
        if rule.piece in _WHOLE_PIECES:
            _copy_whole(dest, tensor, name)
            return
        start, size = piece_rows(rule.piece, self.local_config)
        if (
            tensor.shape[0] != size
            or tensor.shape[1:] != dest.shape[1:]
            or start + size > dest.shape[0]
        ):
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)} does not fit rows "
                f"{start}..{start + size} of {tuple(dest.shape)}"
            )
        dest.data[start : start + size].copy_(tensor)


def piece_rows(piece: str, c: ModelConfig) -> tuple[int, int]:
    """The first row and the row count of `piece` in its fused parameter (this rank's shapes)."""
    expert_width = c.moe.intermediate_size if c.moe is not None else 0
    rows = {
        "q": (0, c.q_size),
        "k": (c.q_size, c.kv_size),
        "v": (c.q_size + c.kv_size, c.kv_size),
        "gate": (0, c.intermediate_size),
        "up": (c.intermediate_size, c.intermediate_size),
        "expert_gate": (0, expert_width),
        "expert_up": (expert_width, expert_width),
    }
    return rows[piece]


def _copy_whole(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}"
        )
    param.data.copy_(tensor)
