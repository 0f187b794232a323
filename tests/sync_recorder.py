"""A stand-in for a CUDA device on the CPU that records every transfer that would make the
host wait for the device (a "synchronizing transfer"), so a CPU test can prove the hot path
has none.

On the CPU every tensor is a host tensor, so the recorder decides which tensors play the
device's part: a tensor is *host* if it was made from Python data or by a factory without
a `device` argument while recording (or computed from host tensors only), or with
`.cpu()`, or lives in memory `memory.staging.pinned_empty` returned (*pinned* host memory);
every other tensor (the model's weights, the worker's tables, anything made with
`device=...` or computed from such tensors) is a *device* tensor.

What it records, as CUDA would behave:

- a device value read by the host: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`,
  `bool()/int()/float()/index()` of a device tensor;
- an op whose output size depends on device data: `nonzero`, `masked_select`, `unique`,
  boolean-mask indexing, `repeat_interleave` without `output_size`;
- a host-to-device copy that waits: `torch.tensor(data, device=...)`, `.to(device)` or
  `copy_` from host memory without `non_blocking=True`, or from pageable (not pinned)
  memory (CUDA stages pageable memory through the driver and may wait for the stream);
- indexing a device tensor with a Python list or a host tensor (an implicit blocking copy
  of the index), and assigning a host tensor into a device tensor.

A device-to-host copy into pinned memory with `non_blocking=True` (how the stream executor
brings tokens back) is not recorded.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}
_DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere"}
_FROM_DATA = {"tensor", "as_tensor"}
_FACTORIES = {
    "empty", "zeros", "ones", "full", "arange", "rand", "randn", "randint", "randperm",
    "linspace", "eye", "empty_strided", "frombuffer", "from_numpy",
}  # fmt: skip
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put", "index_select", "take"}


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _is_list_index(index: Any) -> bool:
    if isinstance(index, list):
        return True
    if isinstance(index, tuple):
        return any(isinstance(i, list) for i in index)
    return False


class SyncRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self._host: set[int] = set()
        self._pinned: set[int] = set()
        self._keep: list[torch.Tensor] = []  # host tensors stay alive: no address reuse
        self.paused_depth = 0

    # -- classification -----------------------------------------------------------------
    @staticmethod
    def _ptr(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def is_host(self, t: torch.Tensor) -> bool:
        return t.numel() == 0 or self._ptr(t) in self._host

    def is_pinned(self, t: torch.Tensor) -> bool:
        return self._ptr(t) in self._pinned

    def mark_host(self, t: torch.Tensor, pinned: bool = False) -> None:
        if t.numel() == 0:
            return
        self._host.add(self._ptr(t))
        if pinned:
            self._pinned.add(self._ptr(t))
        self._keep.append(t)

    def _mark_outputs(self, out: Any, host: bool) -> None:
        if host:
            for t in _tensors(out):
                self.mark_host(t)

    def record(self, what: str) -> None:
        self.events.append(what)

    @property
    def count(self) -> int:
        return len(self.events)

    def counts(self) -> Counter[str]:
        return Counter(self.events)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ops inside are not looked at (a reference implementation the GPU path does not
        run); their outputs count as device tensors."""
        self.paused_depth += 1
        try:
            yield
        finally:
            self.paused_depth -= 1

    def pinned_empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Stands in for `memory.staging.pinned_empty`: host memory that would be pinned."""
        t = torch.empty(numel, dtype=dtype)
        self.mark_host(t, pinned=True)
        return t

    # -- the mode -------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused_depth:
            return out
        name = getattr(func, "__name__", "")
        this = args[0] if args and isinstance(args[0], torch.Tensor) else None
        ins = [t for t in _tensors((args, kwargs))]
        device_ins = [t for t in ins if not self.is_host(t)]

        if name in _READS and this is not None:
            if not self.is_host(this):
                self.record(f"{name} of a device tensor")
            if name == "cpu" and isinstance(out, torch.Tensor):
                self.mark_host(out)
            return out
        if name in _DATA_DEPENDENT and device_ins:
            self.record(f"{name} (output size from device data)")
            return out
        if name == "repeat_interleave" and device_ins and kwargs.get("output_size") is None:
            self.record("repeat_interleave without output_size")
            return out
        if name in _FROM_DATA:
            if kwargs.get("device") is not None:
                self.record(f"torch.{name}(host data, device=...) (blocking copy)")
            else:
                self._mark_outputs(out, host=not device_ins)
            return out
        if name in _FACTORIES:
            self._mark_outputs(out, host=kwargs.get("device") is None)
            return out
        if name in _LIKE:
            self._mark_outputs(out, host=kwargs.get("device") is None and not device_ins)
            return out
        if name in ("to", "cuda") and this is not None:
            return self._to(this, args, kwargs, out, name)
        if name == "copy_" and this is not None and len(args) > 1:
            self._copy(this, args[1], bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False)))
            return out
        if name == "pin_memory" and this is not None:
            self.mark_host(out, pinned=True)
            return out
        if name in _INDEXING and this is not None and not self.is_host(this):
            self._indexing(name, args, kwargs)
            return out
        if name == "__getitem__" and this is not None:
            self._mark_outputs(out, host=True)
            return out
        host_ins = [t for t in ins if self.is_host(t) and t.dim() > 0]
        if device_ins and host_ins and name not in ("__get__", "__set__"):
            self.record(f"{name} mixes host and device tensors (implicit copy)")
        if ins and not device_ins:
            self._mark_outputs(out, host=True)
        return out

    def _to(self, this: torch.Tensor, args: Any, kwargs: dict[str, Any], out: Any, name: str) -> Any:
        target = kwargs.get("device")
        for a in args[1:]:
            if isinstance(a, (str, torch.device)):
                target = a
            elif isinstance(a, torch.Tensor):
                target = "like-a-device-tensor" if not self.is_host(a) else None
        if name == "cuda":
            target = "cuda"
        if not self.is_host(this):
            return out  # device to device (to dtype, or a no-op)
        if target is None:
            self._mark_outputs(out, host=True)  # host dtype change
            return out
        blocking = not kwargs.get("non_blocking", False)
        if blocking:
            self.record("host-to-device copy without non_blocking")
        elif not self.is_pinned(this):
            self.record("non_blocking host-to-device copy from pageable memory")
        if out is this:  # on the CPU `.to("cpu")` is the tensor itself; on CUDA it is a copy
            out = this.clone()
        return out

    def _copy(self, dst: torch.Tensor, src: Any, non_blocking: bool) -> None:
        if not isinstance(src, torch.Tensor):
            return
        dst_host, src_host = self.is_host(dst), self.is_host(src)
        if dst_host == src_host:
            return
        if src_host:  # host to device
            if not non_blocking:
                self.record("copy_ host-to-device without non_blocking")
            elif not self.is_pinned(src):
                self.record("copy_ non_blocking from pageable memory")
        else:  # device to host
            if not (non_blocking and self.is_pinned(dst)):
                self.record("copy_ device-to-host that waits")

    def _indexing(self, name: str, args: Any, kwargs: dict[str, Any]) -> None:
        index = args[1] if len(args) > 1 else kwargs.get("indices")
        if _is_list_index(index):
            self.record(f"{name} with a Python list index (blocking copy)")
        for t in _tensors(index):
            if t.dtype == torch.bool:
                self.record(f"{name} with a boolean mask (output size from device data)")
            elif self.is_host(t) and t.dim() > 0:
                self.record(f"{name} with a host index tensor (blocking copy)")
        if name == "__setitem__" and len(args) > 2:
            value = args[2]
            if isinstance(value, torch.Tensor) and self.is_host(value) and value.dim() > 0:
                self.record("__setitem__ of a host tensor into a device tensor")


@contextlib.contextmanager
def recording(monkeypatch: Any = None) -> Iterator[SyncRecorder]:
    """Record synchronizing transfers inside the block; `memory.staging.pinned_empty`
    returns memory the recorder treats as pinned."""
    from sluice.runtime.memory import staging

    recorder = SyncRecorder()
    original = staging.pinned_empty
    staging.pinned_empty = recorder.pinned_empty
    try:
        with recorder:
            yield recorder
    finally:
        staging.pinned_empty = original
