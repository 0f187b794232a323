"""A request's generations as the routes hand them to the engine: one `Job` per choice
(`fan_out`), and which ends the client gets as an error (`is_failure`)."""

from __future__ import annotations

import dataclasses
import random

from sluice.runtime.entrypoints.request_params import per_choice_params
from sluice.runtime.entrypoints.tokenizer_manager import ABORTED_BY_REQUEST
from sluice.runtime.ipc.messages import FinishReason, SamplingParams


@dataclasses.dataclass(frozen=True)
class Job:
    """One generation: a prompt's ids, one choice's params, and its rid."""

    ids: list[int]
    params: SamplingParams
    rid: str


def fan_out(
    prompts: list[list[int]],
    params: list[SamplingParams],
    ns: list[int],
    rid: str,
    rids: list[str] | None = None,
) -> list[Job]:
    """Prompt-major jobs (choice index = prompt * n + j, as OpenAI indexes them); n > 1
    choices get seeds `seed + j` and rids `<rid>-<j>`; prompt i of several is `<rid>-p<i>`
    unless the client named each (`rids`)."""
    jobs = []
    for i, (ids, p, n) in enumerate(zip(prompts, params, ns, strict=True)):
        base = rids[i] if rids else (rid if len(prompts) == 1 else f"{rid}-p{i}")
        for j, q in enumerate(per_choice_params(p, n, random.getrandbits(63))):
            jobs.append(Job(ids, q, base if n == 1 else f"{base}-{j}"))
    return jobs


def is_failure(reason: FinishReason | None, abort_is_error: bool) -> bool:
    """An end the client gets as an error: an engine fault or a timeout, everywhere; an
    abort it did not ask for, where `abort_is_error` (POST /abort_request aborts, and
    /generate's server-side aborts, are reported in band)."""
    if reason is None:
        return False
    if reason.kind in ("error", "timeout"):
        return True
    return abort_is_error and reason.kind == "abort" and reason.message != ABORTED_BY_REQUEST
