"""FlashInfer attention on Sluice's page tables (GPU only).

FlashInfer reads a paged KV cache through CSR-style metadata: for request `i`, its pages
are `indices[indptr[i]:indptr[i + 1]]` and its last page holds `last_page_len[i]` tokens.
Sluice's pool is already paged: slot `s` is offset `s % page_size` of page
`s // page_size`, and a request's position `p` sits on its `p // page_size`-th page at
offset `p % page_size` (`TokenToKVPoolAllocator.slots`). So the metadata is the request's
`req_to_token` row sampled at every page start, divided by the page size; the K/V buffers
`[slots, kv_heads, head_dim]` are viewed as `[pages, page_size, kv_heads, head_dim]` (NHD).

The metadata functions are pure torch (tested on the CPU against the torch backend's
gather indices); the backend plans a FlashInfer wrapper once per batch, at the first
layer, and runs it for every layer. Decode batches of a CUDA-graph bucket use a wrapper of
their own whose metadata buffers are static (`use_cuda_graph=True`), planned before the
capture and before every replay.

One plan serves every layer, so per-layer options (`LayerAttention`: sliding windows, sink
logits, soft-capping, a layer's own scale) are refused at load (`unsupported`): FlashInfer's
`window_left` and `logits_soft_cap` are plan arguments, and wiring them would take a wrapper
per kind of layer. Such models run on the `triton` or `torch` backend.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.staging import Staging

WORKSPACE_BYTES = 256 * 2**20
# FlashInfer's decode kernels for wide GQA groups are its prefill (tensor-core) kernels
TENSOR_CORE_MIN_GROUP = 4


@dataclass(frozen=True)
class PagedKVLayout:
    """FlashInfer's view of a batch's KV pages (int32 tensors on the batch's device), and
    the host copies of what its `plan` reads on the host (pinned where CUDA is)."""

    indptr: torch.Tensor  # [batch + 1]
    indices: torch.Tensor  # [total pages]
    last_page_len: torch.Tensor  # [batch]
    indptr_host: torch.Tensor
    last_page_len_host: torch.Tensor
    qo_indptr: torch.Tensor | None = None  # [batch + 1], extend only
    qo_indptr_host: torch.Tensor | None = None


def paged_kv_layout(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens_cpu: list[int],
    page_size: int,
    extend_lens_cpu: list[int] | None = None,
) -> PagedKVLayout:
    """The pages holding the first `seq_lens_cpu[i]` tokens of row `req_pool_indices[i]`
    (and, given `extend_lens_cpu`, the query offsets of an extend batch).

    Every size and offset comes from the host-side lengths, staged in one pinned upload,
    and the page indices are gathered on the device: building it never waits for the
    device, and FlashInfer's `plan` gets host tensors for what it reads on the host."""
    device = req_to_token.device
    pages = [-(-n // page_size) for n in seq_lens_cpu]
    total = sum(pages)
    stage = Staging()
    stage.add("counts", pages)
    stage.add("indptr", [0, *itertools.accumulate(pages)], torch.int32)
    stage.add("last_page_len", [(n - 1) % page_size + 1 for n in seq_lens_cpu], torch.int32)
    if extend_lens_cpu is not None:
        stage.add("qo_indptr", [0, *itertools.accumulate(extend_lens_cpu)], torch.int32)
    staged = stage.upload(device)
    indptr = staged["indptr"]
    owner = torch.repeat_interleave(
        torch.arange(len(pages), device=device), staged["counts"], output_size=total
    )
    page_in_req = torch.arange(total, device=device) - indptr[owner]
    rows = req_pool_indices.to(device=device, dtype=torch.int64)[owner]
    first_slots = req_to_token[rows, page_in_req * page_size].to(torch.int64)
    extend = extend_lens_cpu is not None
    return PagedKVLayout(
        indptr=indptr,
        indices=(first_slots // page_size).to(torch.int32),
        last_page_len=staged["last_page_len"],
        indptr_host=staged.host("indptr"),
        last_page_len_host=staged.host("last_page_len"),
        qo_indptr=staged["qo_indptr"] if extend else None,
        qo_indptr_host=staged.host("qo_indptr") if extend else None,
    )


def qo_indptr(extend_lens_cpu: list[int], device: str | torch.device) -> torch.Tensor:
    """Where each request's new tokens start in the flat token dimension, and the end."""
    stage = Staging()
    stage.add("qo_indptr", [0, *itertools.accumulate(extend_lens_cpu)], torch.int32)
    return stage.upload(device)["qo_indptr"]


def paged_view(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """`[slots, kv_heads, head_dim]` as FlashInfer's NHD pages."""
    return cache.view(-1, page_size, cache.shape[1], cache.shape[2])


@dataclass(frozen=True)
class _HeadConfig:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype

    @property
    def use_tensor_cores(self) -> bool:
        return self.num_heads // self.num_kv_heads >= TENSOR_CORE_MIN_GROUP


@dataclass
class _Plan:
    """What the current forward runs: a wrapper and whether it is planned yet."""

    mode: ForwardMode
    num_reqs: int
    num_req_tokens: int
    wrapper: Any
    layout: PagedKVLayout | None  # None: planned already (CUDA-graph bucket)
    qo_indptr: torch.Tensor | None
    planned: bool


class FlashInferAttentionBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(
        self,
        scale: float | None = None,
        *,
        page_size: int = 1,
        device: str | torch.device = "cuda",
        workspace_bytes: int = WORKSPACE_BYTES,
    ) -> None:
        super().__init__(scale)
        import flashinfer  # GPU only; the registry refuses it elsewhere

        self._flashinfer = flashinfer
        self.page_size = page_size
        self.device = torch.device(device)
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        self._heads: _HeadConfig | None = None  # learned at the first forward
        self._decode: Any = None
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self._graph_decode: dict[int, Any] = {}  # batch size -> wrapper with static buffers
        self._graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._plan: _Plan | None = None

    # -- per forward ------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        tokens = sum(batch.extend_lens_cpu)
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # capturing a graph bucket: `init_forward_metadata_for_graph` planned it
            wrapper = self._graph_decode[batch.batch_size]
            self._plan = _Plan(ForwardMode.DECODE, batch.batch_size, tokens, wrapper, None,
                               None, planned=True)  # fmt: skip
            return
        decode = batch.mode == ForwardMode.DECODE
        layout = paged_kv_layout(
            batch.req_to_token, batch.req_pool_indices, batch.seq_lens_cpu, self.page_size,
            None if decode else batch.extend_lens_cpu,
        )  # fmt: skip
        if decode:
            self._plan = _Plan(ForwardMode.DECODE, batch.batch_size, tokens, None, layout,
                               None, planned=False)  # fmt: skip
        else:
            self._plan = _Plan(ForwardMode.EXTEND, batch.batch_size, tokens, self._prefill,
                               layout, layout.qo_indptr_host, planned=False)  # fmt: skip
        if self._heads is not None:
            self._plan_now(self._plan, self._heads)

    def init_forward_metadata_for_graph(self, batch: ForwardBatch) -> None:
        if self._heads is None:
            raise RuntimeError("run one eager forward before capturing a CUDA graph")
        bs = batch.batch_size
        wrapper = self._graph_decode.get(bs)
        if wrapper is None:
            wrapper = self._graph_decode[bs] = self._new_graph_wrapper(bs, batch)
        layout = paged_kv_layout(
            batch.req_to_token, batch.req_pool_indices, batch.seq_lens_cpu, self.page_size
        )
        plan = _Plan(ForwardMode.DECODE, bs, bs, wrapper, layout, None, planned=False)
        self._plan_now(plan, self._heads)

    def unsupported(self, options: LayerAttention) -> str | None:
        if options.is_plain and options.scale is None:
            return None
        return ("the flashinfer backend plans one kernel for all layers and does not implement "
                "per-layer sliding windows, sink logits, soft-capping or scales; use "
                "--attention-backend triton (or torch)")  # fmt: skip

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        problem = self.unsupported(options)
        if problem is not None:
            raise ValueError(problem)
        plan = self._plan
        if plan is None:
            raise RuntimeError("init_forward_metadata() was not called before forward()")
        batch.kv.write(layer_id, batch.out_cache_loc, k, v)
        k_cache, v_cache = batch.kv.k[layer_id], batch.kv.v[layer_id]
        if not plan.planned:
            if self._heads is None:
                self._heads = _HeadConfig(q.shape[1], k_cache.shape[1], q.shape[2], q.dtype,
                                          k_cache.dtype)  # fmt: skip
            self._plan_now(plan, self._heads)
        n = plan.num_reqs if plan.mode == ForwardMode.DECODE else plan.num_req_tokens
        cache = (paged_view(k_cache, self.page_size), paged_view(v_cache, self.page_size))
        result = plan.wrapper.run(q[:n].contiguous(), cache)
        if q.shape[0] == n:
            return result
        out = torch.zeros_like(q)
        out[:n] = result
        return out

    # -- planning ---------------------------------------------------------------------
    def _plan_now(self, plan: _Plan, heads: _HeadConfig) -> None:
        layout = plan.layout
        assert layout is not None
        common = dict(
            sm_scale=self.scale_for(heads.head_dim),
            q_data_type=heads.q_dtype,
            kv_data_type=heads.kv_dtype,
        )
        if plan.mode == ForwardMode.DECODE:
            if plan.wrapper is None:
                plan.wrapper = self._decode_wrapper(heads)
            plan.wrapper.plan(
                layout.indptr_host, layout.indices, layout.last_page_len_host, heads.num_heads,
                heads.num_kv_heads, heads.head_dim, self.page_size, pos_encoding_mode="NONE",
                **common,
            )  # fmt: skip
        else:
            plan.wrapper.plan(
                plan.qo_indptr, layout.indptr_host, layout.indices, layout.last_page_len_host,
                heads.num_heads, heads.num_kv_heads, heads.head_dim, self.page_size,
                causal=True, **common,
            )  # fmt: skip
        plan.planned = True

    def _decode_wrapper(self, heads: _HeadConfig) -> Any:
        if self._decode is None:
            self._decode = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=heads.use_tensor_cores
            )
        return self._decode

    def _new_graph_wrapper(self, bs: int, batch: ForwardBatch) -> Any:
        """A decode wrapper for batch size `bs` whose metadata lives in static buffers
        (shared by all buckets: one replays at a time, each planned right before)."""
        assert self._heads is not None
        if self._graph_buffers is None:
            max_pages = batch.req_to_token.shape[1] // self.page_size + 1
            rows = batch.req_to_token.shape[0]
            self._graph_buffers = (
                torch.zeros(rows + 1, dtype=torch.int32, device=self.device),
                torch.zeros(rows * max_pages, dtype=torch.int32, device=self.device),
                torch.zeros(rows, dtype=torch.int32, device=self.device),
            )
        indptr, indices, last = self._graph_buffers
        if bs > last.shape[0]:
            raise ValueError(f"graph batch size {bs} exceeds the {last.shape[0]} request slots")
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True,
            use_tensor_cores=self._heads.use_tensor_cores,
            paged_kv_indptr_buffer=indptr[: bs + 1], paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last[:bs],
        )  # fmt: skip
