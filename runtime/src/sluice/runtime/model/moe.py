"""One mixture-of-experts MLP layer: a softmax top-k router and SwiGLU experts.

Routing (Qwen3-MoE and Mixtral alike): `softmax` over all experts' router logits in fp32,
the `top_k` largest, optionally rescaled to sum to one (`renormalize`: Qwen3-MoE's
`norm_topk_prob`; Mixtral always, which equals a softmax over the chosen logits).

The experts' weights are stacked: `w13[e]` is expert e's gate rows then its up rows
(`[2 * width, hidden]`), `w2[e]` its down projection (`[hidden, width]`). With tensor
parallelism each rank holds every expert's share of the width (column-split gate/up,
row-split down); the decoder layer's all-reduce adds the ranks' partial sums, and the
router is replicated, so every rank routes alike.

How the experts run (`impl`):
- `grouped`: the (token, choice) pairs are sorted by expert, and each of the two GEMMs is
  one `torch._grouped_mm` over the sorted rows with per-expert offsets: no Python loop over
  experts, experts without tokens cost nothing, and no host sync (CUDA-graph safe);
- `segments`: the same sort, then one GEMM per expert that received tokens (a loop over the
  active experts only; the fallback where `_grouped_mm` lacks the dtype, and w8a8's path);
  bf16 on the CPU with the compiled ops (`fused`) always runs this way, each GEMM the
  row-invariant `sluice_cpu.linear`;
- `w8a8` (after `quantize_w8a8`): the segments path with each expert's projections as
  `W8A8Linear`s (int8 weights per output row, int8 activations per token, `torch._int_mm`);
  the router stays in the model dtype;
- `triton` (the default on CUDA with Triton installed): `model.triton_moe`, the pairs sorted
  and block-padded by expert, each GEMM one launch over all experts, CUDA-graph safe;
- `loop`: transformers' way, a mask per expert over every token (the reference the tests
  and `benchmarks/moe.py` measure the others against).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sluice.runtime.model.config import MoEOptions
from sluice.runtime.model.layers import Linear
from sluice.runtime.model.moe_routing import ExpertOrder, route
from sluice.runtime.model.quantization import W8A8Linear

IMPLS = ("grouped", "segments", "w8a8", "triton", "loop")


def _row_invariant_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.sluice_cpu.linear(x, weight, None, x.dtype)


def grouped_mm_supports(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether `torch._grouped_mm` runs this dtype on this device (tried once, tiny)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.zeros(2, 16, dtype=dtype, device=device)
        b = torch.zeros(2, 16, 16, dtype=dtype, device=device)
        torch._grouped_mm(a, b, offs=torch.tensor([1, 2], dtype=torch.int32, device=device))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def default_impl(dtype: torch.dtype, device: torch.device | str) -> str:
    """triton on CUDA (when installed), else grouped where `_grouped_mm` takes the dtype."""
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            pass
        else:
            return "triton"
    return "grouped" if grouped_mm_supports(dtype, device) else "segments"


class MoE(nn.Module):
    """`sum_k weight_k * expert_k(x)` over each token's `top_k` experts."""

    def __init__(
        self,
        hidden_size: int,
        options: MoEOptions,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        if options.clamp is not None:
            raise ValueError("clamped SwiGLU experts (gpt-oss's) are not implemented by this MoE")
        self.num_experts = options.num_experts
        self.top_k = options.top_k
        self.renormalize = options.renormalize
        self.width = options.intermediate_size  # this rank's share of each expert
        self.fused = False  # SiLU-and-multiply as the compiled CPU op (cpu_fused_ops)
        self.gate = Linear(hidden_size, self.num_experts, False, device, dtype)  # the router
        e, w, h = self.num_experts, self.width, hidden_size
        self.w13 = nn.Parameter(
            torch.empty(e, 2 * w, h, device=device, dtype=dtype), requires_grad=False
        )
        self.w2 = nn.Parameter(
            torch.empty(e, h, w, device=device, dtype=dtype), requires_grad=False
        )
        self.impl = default_impl(dtype, device)
        self.q13: nn.ModuleList | None = None  # per-expert W8A8Linear after quantize_w8a8
        self.q2: nn.ModuleList | None = None

    def quantize_w8a8(self) -> int:
        """Quantize every expert's two projections (the router stays); returns how many."""
        self.q13 = nn.ModuleList(W8A8Linear.from_weight(w, None) for w in self.w13)
        self.q2 = nn.ModuleList(W8A8Linear.from_weight(w, None) for w in self.w2)
        del self.w13, self.w2
        self.impl = "w8a8"
        return 2 * self.num_experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        if self.impl == "loop":
            return self._loop(x, weights, ids)
        if self.impl == "triton":
            from sluice.runtime.model.triton_moe import fused_experts

            return fused_experts(x, self.w13, self.w2, weights, ids, self._act)
        order = ExpertOrder(weights, ids, self.num_experts)
        rows = x[order.rows]
        # the compiled CPU GEMM sums each row alike however many rows an expert gets, so a
        # token's output does not depend on what else its batch routed to the same expert
        row_invariant = self.fused and rows.dtype == torch.bfloat16 and self.impl != "w8a8"
        if self.impl == "grouped" and not row_invariant:
            offsets = order.offsets
            h = torch._grouped_mm(rows, self.w13.transpose(1, 2), offs=offsets)
            out = torch._grouped_mm(self._act(h), self.w2.transpose(1, 2), offs=offsets)
        elif self.impl == "w8a8" and self.q13 is not None and self.q2 is not None:
            out = torch.empty_like(rows)
            for e, start, end in order.active():
                out[start:end] = self.q2[e](self._act(self.q13[e](rows[start:end])))
        else:
            out = torch.empty_like(rows)
            linear = _row_invariant_linear if row_invariant else F.linear
            for e, start, end in order.active():
                h = linear(rows[start:end], self.w13[e])
                out[start:end] = linear(self._act(h), self.w2[e])
        return order.combine(out, x.shape[0])

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused and gate_up.shape[0] > 0:
            return torch.ops.sluice_cpu.silu_mul(gate_up)
        gate, up = gate_up.split(self.width, dim=-1)
        return F.silu(gate) * up

    def _loop(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """transformers' expert loop: for every expert, find its tokens and run it."""
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            token, choice = torch.where(ids == e)
            if token.numel() == 0:
                continue
            h = self._act(F.linear(x[token], self.w13[e]))
            y = F.linear(h, self.w2[e]) * weights[token, choice, None].to(x.dtype)
            out.index_add_(0, token, y)
        return out
