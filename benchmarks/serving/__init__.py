"""The pieces of `benchmarks/bench_serving.py`, one job each.

- `dataset`: the prompts (random and shared-prefix), built from the model's tokenizer.
- `client`: the HTTP load generator and the SSE stream reader.
- `metrics`: per-request results and the numbers computed from them (pure).
- `peer`: Hugging Face transformers' `generate` with static batching on the same prompts.
- `server`: starting and stopping `python -m sluice.runtime serve` for `--launch-server`.
- `report`: the printed table and the JSON document.
"""
