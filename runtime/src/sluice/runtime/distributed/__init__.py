"""Tensor parallelism: one scheduler + model-worker process per rank (SGLang's layout).

- `topology`: which ranks a node runs, where they meet (the rendezvous), what is refused
  at start-up;
- `group`: the collectives, on two process groups: the device group (NCCL on CUDA, gloo on
  the CPU) used only by the forward, and a gloo control group used only by the scheduler
  thread (the per-tick broadcast), so the forward thread of the overlap loop and the
  scheduler thread never issue collectives on the same group;
- `sharding`: which slice of every weight a rank holds and reads from the checkpoint;
- `layers`: the vocab-parallel embedding and LM head;
- `ticks`, `follower`, `grammar_sync`: rank 0 receives from the TokenizerManager and
  broadcasts each tick's messages; every rank runs the same `Scheduler` on them, so every
  rank makes the same decisions; only rank 0 sends outputs and stats.
"""
