"""`--enable-deterministic-inference` on CUDA: the model's linear layers (the LM head with
fp32 output) run the Triton batch-invariant matmul (`kernels/triton_batch_invariant.py`) and
its RMSNorms one Triton program per row (`kernels/triton_fused.py`), instead of cuBLAS and
torch's reductions, whose kernels change with the number of rows. Attention in that mode is
`attention.batch_invariant` (its GEMMs on the same Triton kernel).

Not covered: MoE experts (torch's grouped GEMM or the Triton MoE kernel), Gemma's and
gpt-oss's own norms, and w8a8 (refused with the flag). On the CPU the default kernels are
row-invariant already (`model.cpu_fused_ops`).
"""

from __future__ import annotations

from torch import nn

from sluice.runtime.model.layers import Linear, RMSNorm


def enable(model: nn.Module) -> int:
    """Switch every `Linear` and `RMSNorm` to its batch-invariant kernel; how many."""
    switched = 0
    for module in model.modules():
        if isinstance(module, (Linear, RMSNorm)):
            module.batch_invariant = True
            switched += 1
    return switched
