"""Per-request grammar state and the batched token bitmask.

The bitmask is an int32 CPU tensor `[batch, ceil(vocab / 32)]`, bit `t % 32` of word
`t // 32` set when token t is allowed. Matchers fill their rows on the CPU; the mask goes
to the logits' device once per step and is applied in place to the constrained rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sluice.runtime.constrained.compiler import CompiledGrammar
from sluice.runtime.memory import staging


class GrammarMatcher:
    """One request's position in its grammar.

    Invariant: `num_accepted` is the number of tokens accepted and not rolled back; the
    matcher's state is exactly that of a fresh matcher fed those tokens in order.
    """

    def __init__(self, grammar: CompiledGrammar) -> None:
        import xgrammar as xgr

        self.grammar = grammar
        self._m = xgr.GrammarMatcher(grammar.compiled)
        self.num_accepted = 0

    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token. False (state unchanged) when the grammar does not
        allow it: the caller must end the request, it can no longer match."""
        ok = bool(self._m.accept_token(int(token_id)))
        if ok:
            self.num_accepted += 1
        return ok

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (0 <= num_tokens <= num_accepted)."""
        if not 0 <= num_tokens <= self.num_accepted:
            raise ValueError(
                f"cannot roll back {num_tokens} tokens; {self.num_accepted} were accepted"
            )
        if num_tokens:
            self._m.rollback(num_tokens)
            self.num_accepted -= num_tokens

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (CPU int32)."""
        self._m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        """A stop token was accepted after a complete match: the output is finished."""
        return bool(self._m.is_terminated())

    def is_completed(self) -> bool:
        """The output so far is a complete match (a stop token is now allowed)."""
        return bool(self._m.is_completed())

    def reset(self) -> None:
        self._m.reset()
        self.num_accepted = 0


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed host bitmask `[batch_size, ceil(vocab_size / 32)]` (int32), in pinned
    memory where CUDA is, so its copy to the device does not wait."""
    words = (vocab_size + 31) // 32
    bitmask = staging.pinned_empty(batch_size * words, torch.int32).view(batch_size, words)
    return bitmask.fill_(-1)


def fill_token_bitmask(
    matchers: Sequence[GrammarMatcher | None], bitmask: torch.Tensor
) -> list[int]:
    """Fill the rows of the constrained requests (row i for `matchers[i]`); returns those
    row indices, to pass to `apply_token_bitmask`. Unconstrained rows are not touched."""
    rows = []
    for i, m in enumerate(matchers):
        if m is not None:
            m.fill_next_token_bitmask(bitmask, i)
            rows.append(i)
    return rows


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | None = None
) -> None:
    """Set the disallowed logits of `rows` (None: every row, the bitmask's rows matching
    the logits') to -inf, in place (logits `[B, V]`, any device).

    The model's V may differ from the grammar's vocabulary: columns the bitmask does not
    cover are disallowed for constrained rows; bits past V are ignored. With every row and a
    bitmask in pinned memory (`allocate_token_bitmask`) nothing here waits for the device.
    """
    if rows is not None and not rows:
        return
    import xgrammar as xgr

    covered = bitmask.shape[-1] * 32
    width = logits.shape[-1]
    mask = bitmask.to(logits.device, non_blocking=True)
    index: Any = None if rows is None else list(rows)
    xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=min(width, covered), indices=index)
    if width > covered:
        if index is None:
            logits[:, covered:] = float("-inf")
        else:
            logits[torch.tensor(index, device=logits.device), covered:] = float("-inf")
