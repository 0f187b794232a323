"""Tensor parallelism: one scheduler + model-worker process per rank (SGLang's layout).

- `topology`: which ranks a node runs, where they meet (the rendezvous), what is refused
  at start-up;
- `group`: the collectives, on two process groups: the device group (NCCL on CUDA, gloo on
  the CPU) used only by the forward, and a gloo control group used only by the scheduler
  thread (the per-tick broadcast), so the forward thread of the overlap loop and the
  scheduler thread never issue collectives on the same group;
- `sharding`: which slice of every weight a rank holds and reads from the checkpoint;
- `layers`: the vocab-parallel embedding and LM head.
Rank 0's ticks replayed on the other ranks are the scheduler's (`scheduler/ranks.py`).
"""
