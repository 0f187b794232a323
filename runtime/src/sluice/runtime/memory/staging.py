"""One pinned host buffer per step: every host-side value a forward needs (token rows and
positions, lengths, table writes, per-row sampling parameters) is packed into it and sent
to the device with a single `non_blocking` copy.

Why: a `torch.tensor(list, device="cuda")` or a `.to("cuda")` from pageable memory makes
the host wait for everything already queued on the stream, so in the overlap loop the
scheduler thread would wait for the forward it has just launched. A copy from pinned
memory with `non_blocking=True` is queued like a kernel and returns at once.

The buffer comes from torch's pinned-memory allocator (`pinned_empty`), which hands a
block out again only after the copies that read it have finished, so a buffer per step is
safe and cheap. On the CPU nothing is pinned and the copy is a plain memcpy; the code path
is the same, which is what the CPU tests check (tests/sync_recorder.py).

    stage = Staging()
    stage.add("positions", positions)                  # int64 by default
    stage.add("indptr", indptr, torch.int32)
    stage.add("temperature", temps, torch.float32)
    staged = stage.upload(device)
    staged["positions"]        # a device tensor (a view of the one device buffer)
    staged.host("indptr")      # the pinned host copy, for APIs that want host metadata
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_ALIGN = 8  # bytes: every segment starts on an 8-byte boundary
_KINDS = (torch.int64, torch.int32, torch.float32)


def pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Host memory the device can copy from without waiting (pinned where CUDA is)."""
    return torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())


@dataclass(frozen=True)
class _Segment:
    dtype: torch.dtype
    offset: int  # bytes into the buffer
    length: int  # elements


class Staged:
    """The device (and pinned host) views of one uploaded step."""

    def __init__(
        self, device_buf: torch.Tensor, host_buf: torch.Tensor, segments: dict[str, _Segment]
    ) -> None:
        self._device = device_buf
        self._host = host_buf
        self._segments = segments

    @staticmethod
    def _view(buf: torch.Tensor, seg: _Segment) -> torch.Tensor:
        size = seg.dtype.itemsize
        return buf[seg.offset : seg.offset + seg.length * size].view(seg.dtype)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._view(self._device, self._segments[name])

    def host(self, name: str) -> torch.Tensor:
        return self._view(self._host, self._segments[name])

    def __contains__(self, name: str) -> bool:
        return name in self._segments


class Staging:
    """Host values of one step, by name; `upload` sends them all in one copy."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[torch.dtype, Sequence[int] | Sequence[float]]] = {}

    def add(
        self, name: str, values: Sequence[int] | Sequence[float], dtype: torch.dtype = torch.int64
    ) -> None:
        if dtype not in _KINDS:
            raise ValueError(f"staging holds {_KINDS}, not {dtype}")
        if name in self._values:
            raise ValueError(f"{name} staged twice")
        self._values[name] = (dtype, values)

    def upload(self, device: str | torch.device) -> Staged:
        segments: dict[str, _Segment] = {}
        offset = 0
        for name, (dtype, values) in self._values.items():
            segments[name] = _Segment(dtype, offset, len(values))
            offset += -(-len(values) * dtype.itemsize // _ALIGN) * _ALIGN
        host = pinned_empty(max(offset, _ALIGN), torch.uint8)
        for dtype in _KINDS:  # one host copy per dtype from the Python values
            names = [n for n, (d, _) in self._values.items() if d == dtype]
            for name in names:
                seg, values = segments[name], self._values[name][1]
                if seg.length:
                    Staged._view(host, seg).copy_(torch.tensor(values, dtype=dtype))
        device_buf = torch.empty(host.shape, dtype=torch.uint8, device=device)
        device_buf.copy_(host, non_blocking=True)
        return Staged(device_buf, host, segments)
