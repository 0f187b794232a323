"""`ReqToTokenPool`: request slots, each a row mapping token positions to KV slots."""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """`[max_running_requests, max_context_len]` int32 table; a running request owns one row.

    Row `r`, column `p` holds the KV slot of token position `p` of the request in row `r`.
    The number of rows is the scheduler's request-slot limit.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self._free: list[int] = list(range(size - 1, -1, -1))
        self._in_use = [False] * size

    @property
    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        row = self._free.pop()
        self._in_use[row] = True
        return row

    def free(self, row: int) -> None:
        if not self._in_use[row]:
            raise RuntimeError(f"request slot {row} freed twice")
        self._in_use[row] = False
        self._free.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)
