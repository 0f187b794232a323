"""Constrained decoding with xgrammar: compile a request's constraint once, mask the logits
of its row at every step, advance its matcher with every accepted token.

The request side (built and validated by the API, `entrypoints/constraints.py`):
`SamplingParams.constraint` is a `Constraint(kind, spec, strict)` or None. Kinds:
json_schema, json_object, regex, choice, ebnf, lark (see `ipc.messages.Constraint`).
The API has already run `validate(constraint)`, so compilation failing in the scheduler
means only a tokenizer-level problem; it still raises `GrammarError`.

How the scheduler and sampler use it:

    compiler = GrammarCompiler(tokenizer, model_vocab_size, eos_token_ids, GrammarConfig())

    # on arrival, off the hot path (the request waits until the future is done):
    req.grammar_future = compiler.compile_async(req.sampling.constraint)
    ...
    try:
        req.matcher = GrammarMatcher(req.grammar_future.result())
    except GrammarError as exc:              # finish the request: abort, exc.reason
        ...

    # each step, before sampling (rows = the batch's row order):
    bitmask = allocate_token_bitmask(batch_size, compiler.vocab_size)   # or reuse one
    rows = fill_token_bitmask([r.matcher for r in batch], bitmask)
    apply_token_bitmask(logits, bitmask, rows)        # in place, logits [B, V] any device
    # ... sample (greedy, top-p, ...) from the masked logits ...

    # after sampling, for each constrained request, in token order:
    if not req.matcher.accept_token(token):   # cannot happen when the mask was applied
        ...                                   # finish the request (abort)
    if req.matcher.is_terminated():           # the grammar accepted a stop token
        ...                                   # finish with 'stop' (EOS is the token)

    # overlap loop: batch N+1's mask needs batch N's token accepted first.
    # a sampled token that is thrown away (request finished while its token was in
    # flight, speculative tokens): req.matcher.rollback(k)
    # retraction keeps the generated tokens, so the matcher keeps its state; a scheduler
    # that re-generates tokens after retraction rolls back the dropped ones (rollback(n)).

Logprobs are of the raw distribution, before the mask (the sampler computes them before
`apply_token_bitmask`), like vLLM's `raw_logprobs`.
"""

from sluice.runtime.constrained.compiler import CompiledGrammar, GrammarCompiler, GrammarConfig
from sluice.runtime.constrained.matcher import (
    GrammarMatcher,
    allocate_token_bitmask,
    apply_token_bitmask,
    fill_token_bitmask,
)
from sluice.runtime.constrained.spec import CONSTRAINT_KINDS, GrammarError, validate

__all__ = [
    "CONSTRAINT_KINDS",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarConfig",
    "GrammarError",
    "GrammarMatcher",
    "allocate_token_bitmask",
    "apply_token_bitmask",
    "fill_token_bitmask",
    "validate",
]
