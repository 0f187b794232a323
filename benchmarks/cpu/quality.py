"""Quality of the CPU fast path against Sluice's own fp32 (HF-exact) forward, same weights.

    python -m benchmarks.cpu.quality [--configs bf16-cpu,w8a8-cpu] [--new-tokens 32]
    python -m benchmarks.cpu.quality --served [--new-tokens 32]

For each configuration: greedy generations of `--new-tokens` tokens on a fixed set of chat
prompts (share of prompts whose first 8 words equal fp32's, mean share of tokens equal up
to the first difference) and the perplexity of a fixed text. The reference is
`fp32-torch` (the path the fp32 logits-vs-transformers tests pin).

`--served` asks the same through real servers as users run them (the `cpu` backend, the
radix cache on; `--dtype float32`, `--dtype bfloat16`, and bf16 with `--quantization
w8a8`): every prompt twice, the repeat answered over its cached prefix, each compared with
the fp32 server's first answer.
"""

from __future__ import annotations

import argparse
import math
import socket
import tempfile
from pathlib import Path

import httpx
import torch

from benchmarks.cpu.step import Runner, load
from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.forward import ForwardMode
from sluice.runtime.model.loader import load_tokenizer, resolve_model_path

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "Give me three tips for a job interview.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Name three planets of the solar system.",
    "What does a Kubernetes pod contain?",
    "Suggest a name for a small bakery.",
    "How do I boil an egg?",
    "What is the difference between a list and a tuple in Python?",
    "Write one sentence about autumn.",
    "Who wrote Romeo and Juliet?",
    "What is photosynthesis?",
    "List two benefits of regular exercise.",
]

# a fixed text for perplexity (written for this benchmark)
TEXT = (
    "The river rises in the hills north of the town and runs south through farmland for "
    "about forty miles before it reaches the sea. In spring the snow on the hills melts and "
    "the water level climbs quickly, so the town built a series of gates and channels to "
    "control the flow. Each gate can be opened or closed by hand, and a keeper walks the "
    "length of the channel every morning to check that nothing is blocked. Over the years "
    "the system has been repaired many times, but the basic design has not changed: water "
    "that is not needed by the mills is sent around the town and back into the river below "
    "the bridge. Visitors often ask why the channels are so narrow. The answer is that a "
    "narrow channel moves water faster, which keeps silt from settling on the bottom."
)


def chat_ids(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def generate(model, dtype, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    longest = max(len(p) for p in prompts)
    runner = Runner.create(model, len(prompts), longest + new_tokens + 2, dtype)
    out = [[t] for t in runner.forward(ForwardMode.EXTEND, prompts).argmax(-1).tolist()]
    for _ in range(new_tokens - 1):
        nxt = runner.forward(ForwardMode.DECODE, [[o[-1]] for o in out]).argmax(-1).tolist()
        for o, t in zip(out, nxt, strict=True):
            o.append(t)
    return out


def perplexity(model, dtype, ids: list[int]) -> float:
    runner = Runner.create(model, 1, len(ids) + 2, dtype)
    logits = runner.forward(ForwardMode.EXTEND, [ids], all_logits=True)
    logprobs = torch.log_softmax(logits[:-1].float(), dim=-1)
    nll = -logprobs.gather(1, torch.tensor(ids[1:])[:, None]).mean().item()
    return math.exp(nll)


def first_words_equal(tokenizer, a: list[int], b: list[int], words: int = 8) -> bool:
    wa = tokenizer.decode(a, skip_special_tokens=True).split()[:words]
    wb = tokenizer.decode(b, skip_special_tokens=True).split()[:words]
    return wa == wb


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


SERVED = {
    "fp32": "--dtype float32",
    "bf16": "--dtype bfloat16",
    "w8a8": "--dtype bfloat16 --quantization w8a8",
    "w8a16": "--dtype bfloat16 --quantization w8a16",
}


def served_answers(flags: str, prompts: list[list[int]], new_tokens: int) -> list[list[list[int]]]:
    """Per prompt, the output ids of its first ask and of its repeat, from one server."""
    from benchmarks.serving.server import launched_server, serve_command

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    body = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    answers = []
    with tempfile.TemporaryDirectory() as tmp, launched_server(
        serve_command("smollm2-135m", url, flags), url, 600, log_path=Path(tmp) / "server.log"
    ):
        for ids in prompts:
            asks = []
            for _ in range(2):
                r = httpx.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": body},
                               timeout=600)  # fmt: skip
                r.raise_for_status()
                asks.append(r.json()["output_ids"])
            answers.append(asks)
    return answers


def served_report(tokenizer, prompts: list[list[int]], new_tokens: int) -> None:
    results = {name: served_answers(flags, prompts, new_tokens) for name, flags in SERVED.items()}
    reference = [first for first, _ in results["fp32"]]
    print(f"{len(prompts)} chat prompts, {new_tokens} greedy tokens through the server "
          "(radix cache on); each asked twice, compared with the fp32 server's first answer")
    print(f"{'config':<8}{'first ask: 8 words = fp32':>28}{'repeat: 8 words = fp32':>25}"
          f"{'repeat = first ask':>21}")
    for name, asks in results.items():
        first = sum(first_words_equal(tokenizer, a, r) for (a, _), r in zip(asks, reference, strict=True))
        again = sum(first_words_equal(tokenizer, b, r) for (_, b), r in zip(asks, reference, strict=True))
        same = sum(a == b for a, b in asks)
        n = len(prompts)
        print(f"{name:<8}{first:>20}/{n:<7}{again:>17}/{n:<7}{same:>13}/{n:<7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default="")
    parser.add_argument("--configs", default="fp32-cpu,bf16-cpu,w8a8-cpu,w8a16-cpu")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--served", action="store_true",
                        help="through real servers with the radix cache on, each prompt twice")
    args = parser.parse_args()
    path = Path(args.model_path) if args.model_path else resolve_model_path(
        "smollm2-135m", default_cache_dir())
    tokenizer = load_tokenizer(path)
    prompts = [chat_ids(tokenizer, p) for p in PROMPTS]
    if args.served:
        served_report(tokenizer, prompts, args.new_tokens)
        return
    text_ids = tokenizer.encode(TEXT)
    results = {}
    for config in ["fp32-torch", *args.configs.split(",")]:
        model, dtype = load(config, path)
        results[config] = (generate(model, dtype, prompts, args.new_tokens),
                           perplexity(model, dtype, text_ids))  # fmt: skip
        del model
    ref_outputs, ref_ppl = results["fp32-torch"]
    print(f"{len(PROMPTS)} chat prompts, {args.new_tokens} greedy tokens; "
          f"perplexity of a {len(text_ids)}-token text")
    print(f"{'config':<12}{'first 8 words = fp32':>22}{'tokens = fp32 (prefix)':>24}{'perplexity':>12}")
    for config, (outputs, ppl) in results.items():
        words = sum(first_words_equal(tokenizer, o, r) for o, r in zip(outputs, ref_outputs, strict=True))
        prefix = sum(common_prefix(o, r) for o, r in zip(outputs, ref_outputs, strict=True))
        share = prefix / (len(PROMPTS) * args.new_tokens)
        print(f"{config:<12}{words:>14}/{len(PROMPTS):<7}{share:>23.1%}{ppl:>12.3f}"
              f"  ({ppl / ref_ppl - 1:+.1%} vs fp32)")


if __name__ == "__main__":
    main()
