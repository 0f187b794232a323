"""Tensor parallelism: one scheduler + model-worker process per rank (SGLang's layout).

- `topology`: which ranks a node runs, where they meet (the rendezvous), what is refused
  at start-up;
- `group`: the collectives, on two process groups: the device group (NCCL on CUDA, gloo on
  the CPU) used only by the forward, and a gloo control group used only by the scheduler
  thread (the per-tick broadcast), so the forward thread of the overlap loop and the
  scheduler thread never issue collectives on the same group.
Which slice of every weight a rank holds, and whether a model can be split N ways, is the
model's business (`model/sharding.py`, the vocab-parallel layers in
`model/parallel_layers.py`); rank 0's ticks replayed on the other ranks are the scheduler's
(`scheduler/ranks.py`).
"""
