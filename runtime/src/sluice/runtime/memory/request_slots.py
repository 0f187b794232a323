"""`RequestSlots`: the rows of the request->token tables, one per running request.

A request that holds KV owns one row: row `r` of the device's `req_to_token` table maps
its token positions to KV slots, and row `r` of the device's token table holds its token
ids (both owned by the model worker). This class only hands rows out and takes them back;
the number of rows is the scheduler's request-slot limit (`--max-running-requests`).
"""

from __future__ import annotations


class RequestSlots:
    def __init__(self, size: int, max_context_len: int) -> None:
        self.size = size
        self.max_context_len = max_context_len
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
