"""Same question, same answer, counted: sixteen short chat questions (the README's among them,
`tests/integration/test_same_answer_http.py`'s set) asked of a launched server, 16 greedy
tokens each, with their log-probs. Prints how many come back the same asked again, asked
all at once (queued while the scheduler is paused, so they share batches), and as second
chat turns against a server without the prefix cache; text and bits (log-probs) apart.

    python benchmarks/same_answer.py                      # the default configuration
    python benchmarks/same_answer.py --dtype bfloat16 --enable-deterministic-inference

Any flags are passed to both servers. The test asserts 16/16 of each; this counts them,
so a tree without the fix can be measured too (`PYTHONPATH` at its `runtime/src`).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]

from server_process import hold_env, serve  # noqa: E402
from test_same_answer_http import QUESTIONS, all_at_once, ask, second_turn  # noqa: E402


def main(flags: list[str]) -> None:
    tmp = Path(tempfile.mkdtemp())
    hold, env = hold_env(tmp / "hold")
    with serve("smollm2-135m", tmp / "cached.log", *flags, env=env) as srv:
        first = [ask(srv.url, q) for q in QUESTIONS]
        again = [ask(srv.url, q) for q in QUESTIONS]
        turns = [second_turn(srv.url, q, a) for q, (a, _) in zip(QUESTIONS, first, strict=True)]
        together = all_at_once(srv.url, hold, [lambda q=q: ask(srv.url, q) for q in QUESTIONS])
    with serve("smollm2-135m", tmp / "uncached.log", *flags, "--disable-radix-cache") as ref:
        ref_turns = [second_turn(ref.url, q, a) for q, (a, _) in zip(QUESTIONS, first, strict=True)]
    n = len(QUESTIONS)

    def same(xs: list, ys: list) -> str:
        text = sum(x[0] == y[0] for x, y in zip(xs, ys, strict=True))
        bits = sum(x == y for x, y in zip(xs, ys, strict=True))
        return f"text {text}/{n}, bits {bits}/{n}"

    print(f"flags {flags}; the README's question: {first[0][0]!r}")
    print(f"  asked again:                    {same(again, first)}")
    print(f"  all at once:                    {same(together, first)}")
    print(f"  second turn = no-cache server:  {same(turns, ref_turns)}")


if __name__ == "__main__":
    main(sys.argv[1:])
