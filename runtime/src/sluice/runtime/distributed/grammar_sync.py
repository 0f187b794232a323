"""Grammar readiness decided by rank 0, so every rank admits a constrained request at the
same tick.

Each rank compiles every grammar itself (its scheduler advances its own matchers with the
tokens all ranks share), but when a compilation finishes differs by rank. Rank 0 says
which requests are ready (those whose grammar finished on rank 0) and the other ranks wait
for exactly those. `ready()` is called at the same point of every rank's identical
schedule, on the scheduler thread, so the broadcast is on the control group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.constrained import GrammarCompiler
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.ipc import codec
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.scheduler.grammar import GrammarQueue
from sluice.runtime.scheduler.request import Req


@dataclass
class SyncedGrammarQueue(GrammarQueue):
    tp: TensorParallelGroup = field(default=SINGLE_RANK)

    def ready(self) -> tuple[list[Req], list[tuple[Req, FinishReason]]]:
        mine = [req.rid for req, future in self.pending.values() if future.done()]
        rids = codec.decode(self.tp.broadcast_bytes(codec.encode(mine) if self.tp.is_leader else None))
        return self.take(set(rids))


def grammar_queue(compiler: GrammarCompiler, tp: TensorParallelGroup) -> GrammarQueue:
    return SyncedGrammarQueue(compiler, tp=tp) if tp.size > 1 else GrammarQueue(compiler)
