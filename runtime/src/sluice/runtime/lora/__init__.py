"""Multi-LoRA serving: PEFT adapters (`adapter.py`), the batched LoRA matmuls (`ops.py`
on the CPU, `triton_sgmv.py` on the GPU) and the per-worker adapter slots (`manager.py`)."""
