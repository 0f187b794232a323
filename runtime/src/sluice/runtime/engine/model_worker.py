"""`ModelWorker`: owns the model and every device tensor; runs forward + sample.

Device state, all owned here and written only by `run` (so, in the overlap loop, only on
the forward thread, in launch order):

- the K/V buffers (`KVBuffers`);
- `req_to_token[row, position]`: the KV slot of each token of the request in `row`;
- `token_table[row, position]`: its token ids, prompt and output; a forward writes the
  token it samples at the next position, where the next decode reads its input.

The scheduler keeps the host bookkeeping (pages, rows) and sends a `ForwardInput`; the
worker knows nothing of requests, queues or overlap.

With tensor parallelism every rank's worker runs the same `ForwardInput` on its shard of
the model and its share of the KV pool (its KV heads); rank 0 samples (its requests'
generators, penalties and grammar masks) and broadcasts the tokens, so every rank's token
table holds the same tokens.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.batch_invariant import ROW_MULTIPLE, BatchInvariantAttentionBackend
from sluice.runtime.attention.hybrid import HybridWindowAttention
from sluice.runtime.attention.registry import auto_fallback_name, resolve_backend_name
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.engine.adapters import create_lora_manager
from sluice.runtime.engine.config import EngineConfig
from sluice.runtime.engine.cpu_features import choose_dtype, choose_kv_dtype
from sluice.runtime.engine.cuda_graph import (
    CudaGraphRunner,
    capture_batch_sizes,
    cuda_graph_disabled_reason,
)
from sluice.runtime.engine.engine_faults import EngineUnusable
from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput
from sluice.runtime.engine.gpu_defaults import resolve_for_model
from sluice.runtime.engine.sampler import (
    SampleOutput,
    SamplingTensors,
    TokenHistory,
    needs_history,
    sample,
)
from sluice.runtime.engine.step_inputs import (
    forward_batch_of,
    next_positions,
    stage_step,
    write_tables,
)
from sluice.runtime.engine.worker_setup import (
    SlidingLayers,
    attention_backend,
    fallback_backend,
    pool_layout,
    set_torch_threads,
)
from sluice.runtime.features import ALL as ALL_FEATURES
from sluice.runtime.forward import ForwardBatch, WindowKV
from sluice.runtime.ipc.messages import SchedulerReady
from sluice.runtime.memory.kv_buffers import KVBuffers, bytes_per_token
from sluice.runtime.memory.staging import Staged
from sluice.runtime.model import batch_invariant_ops, cpu_fused_ops
from sluice.runtime.model.loader import load_model, load_tokenizer
from sluice.runtime.model.quantization import quantize_model

logger = logging.getLogger("sluice.model_worker")


class ModelWorker:
    def __init__(
        self, flags: Any, model_path: str | Path, tp: TensorParallelGroup = SINGLE_RANK
    ) -> None:
        """`flags`: the server's parsed flags (or an `EngineConfig`); the worker keeps
        `EngineConfig.of` them, after resolving the GPU's auto sizes."""
        flags = resolve_for_model(flags, Path(model_path))  # GPU: the auto sizes (gpu_defaults)
        self.args = flags  # for the composition root (the scheduler's own flags); not read here
        self.config = args = EngineConfig.of(flags)
        self.tp = tp
        self.device = args.resolved_device
        choice = choose_dtype(args.dtype, self.device)
        self.dtype, self.dtype_reason = choice.dtype, choice.reason
        self.kv_dtype = choose_kv_dtype(args.kv_cache_dtype, self.dtype)
        logger.info("dtype %s (%s), KV cache %s", choice.name, choice.reason, self.kv_dtype)
        set_torch_threads(args, self.device, tp)
        torch.manual_seed(max(args.random_seed, 0))
        backend = attention_backend(args, self.device, self.dtype)
        # deterministic mode where the kernels are not row-invariant (fp32, CUDA): every
        # matmul gets a row count that is a multiple of ROW_MULTIPLE, attention the torch
        # batch-invariant backend
        self.padded_rows = isinstance(backend, BatchInvariantAttentionBackend)
        self.model, self.model_config = load_model(
            Path(model_path), self.device, self.dtype, backend, tp,
            fallback_backend(args, self.device),
        )  # fmt: skip
        # `auto`'s fallback, when the backend it chose could not run the model: the one it
        # chose goes (its workspaces too, before the KV pool is sized from free memory)
        self.fallback_name: str | None = None
        if self.model.attn_backend is not backend:
            del backend
            backend = self.model.attn_backend
            self.fallback_name = auto_fallback_name(args.attention_backend, self.device)
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
        if (quantized := quantize_model(self.model, args.quantization)) > 0:
            logger.info("quantization %s: %d linear layers", args.quantization, quantized)
        if self.device.startswith("cuda") and args.enable_deterministic_inference:
            switched = batch_invariant_ops.enable(self.model)
            logger.info("deterministic inference: %d layers on batch-invariant Triton kernels",
                        switched)  # fmt: skip
        if self.device == "cpu" and (reason := cpu_fused_ops.enable(self.model)) is not None:
            logger.warning("fused CPU ops unavailable (%s); running the torch ops", reason)
        self.lora = create_lora_manager(args, self.model, self.device, self.dtype, str(model_path))
        self.tokenizer = load_tokenizer(Path(model_path))
        cfg = self.model_config
        eos = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = sorted(eos)

        kv_heads = self.model.local_config.num_key_value_heads  # this rank's share
        per_token = bytes_per_token(cfg.num_hidden_layers, kv_heads, cfg.head_dim, self.kv_dtype)
        self.sliding = self._sliding_layers(kv_heads)  # the model's, whatever the flags say
        sliding = None if args.disable_hybrid_swa_memory else self.sliding
        # the same backend again for the sliding layers (planning their view of each batch),
        # built before the pool is sized from free memory, so its workspace is counted
        window_backend = self._backend_again(args) if sliding is not None else None
        self.pool = pool_layout(args, cfg.context_length, per_token, self.device, tp, sliding)
        total, page, context = self.pool.total_tokens, self.pool.page_size, self.pool.context_len
        if not self.pool.window_tokens:
            sliding = window_backend = None  # one pool after all (`every_layer_slides`)
        full_layers = None if sliding is None else set(range(cfg.num_hidden_layers)) - set(sliding.layers)
        self.kv = KVBuffers(
            (total // page + 1) * page, cfg.num_hidden_layers, kv_heads,
            cfg.head_dim, self.kv_dtype, self.device, full_layers,
        )
        table = (args.max_running_requests, context + page + 1)
        self.req_to_token = torch.zeros(table, dtype=torch.int32, device=self.device)
        self.token_table = torch.zeros(table, dtype=torch.int32, device=self.device)
        self.window: WindowKV | None = None
        if sliding is not None:
            window_kv = KVBuffers(
                (self.pool.window_tokens // page + 1) * page, cfg.num_hidden_layers, kv_heads,
                cfg.head_dim, self.kv_dtype, self.device, sliding.layers,
            )
            self.window = WindowKV(window_kv, torch.zeros(table, dtype=torch.int32, device=self.device))
            assert window_backend is not None
            backend = HybridWindowAttention(self.model.attn_backend, window_backend, bool(full_layers))
            self.model.attn_backend = backend
        window_bytes = self.window.kv.total_bytes if self.window is not None else 0
        logger.info(
            "KV pool: %d tokens, %.1f MiB (%d bytes/token, %d of %d KV heads, %s on %s)",
            total, (self.kv.total_bytes + window_bytes) / 2**20, self.kv.bytes_per_token,
            kv_heads, cfg.num_key_value_heads, self.kv_dtype, self.device,
        )
        self.graph_runner = self._capture_cuda_graphs(backend)

    def _capture_cuda_graphs(self, backend: AttentionBackend) -> CudaGraphRunner | None:
        """Decode CUDA graphs, captured once the pool is sized (so before the scheduler
        reports ready and /health turns 200)."""
        args = self.config
        off = cuda_graph_disabled_reason(
            self.device, backend, args.disable_cuda_graph, args.enable_deterministic_inference
        )
        if off is None and self.window is not None:
            off = "the sliding-window layers' own KV pool (--disable-hybrid-swa-memory keeps graphs)"
        if off is None and self.lora is not None:
            off = "LoRA adapters (--enable-lora: the batch's adapter segments are host-built)"
        if off is None and self.tp.size > 1:
            off = "tensor parallelism (the collectives are not captured)"
        if off is not None:
            logger.info("decode CUDA graphs off: %s", off)
            return None
        sizes = capture_batch_sizes(args.cuda_graph_max_bs, args.max_running_requests)
        runner = CudaGraphRunner(self.model, sizes)
        runner.capture(self.req_to_token, self.kv)
        return runner

    @property
    def attention_backend_name(self) -> str:
        if self.padded_rows:
            return "batch-invariant"
        if self.config.enable_deterministic_inference:
            return "cpu"
        if self.fallback_name is not None:
            return self.fallback_name
        return resolve_backend_name(self.config.attention_backend, self.device)

    @property
    def context_len(self) -> int:
        return self.pool.context_len

    def decode_text(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def ready_message(self) -> SchedulerReady:
        return SchedulerReady(
            max_total_tokens=self.pool.total_tokens,
            max_running_requests=self.config.max_running_requests,
            context_len=self.pool.context_len,
            page_size=self.pool.page_size,
            vocab_size=self.model_config.vocab_size,
            eos_token_ids=self.eos_token_ids,
            device=self.device,
            dtype=str(self.dtype).removeprefix("torch."),
            attention_backend=self.attention_backend_name,
            model_context_len=self.pool.model_context_len,
            features=sorted(ALL_FEATURES),
            dtype_reason=self.dtype_reason,
            kv_cache_dtype=str(self.kv_dtype).removeprefix("torch."),
            quantization=self.config.quantization,
            torch_threads=torch.get_num_threads(),
            tensor_parallel_size=self.tp.size,
        )

    def _backend_again(self, args: EngineConfig) -> AttentionBackend:
        """A second instance of the backend the model runs (`auto`'s fallback if it took it)."""
        if self.fallback_name is not None and (make := fallback_backend(args, self.device)):
            return make()
        return attention_backend(args, self.device, self.dtype)

    def _sliding_layers(self, kv_heads: int) -> SlidingLayers | None:
        """The model's sliding-window layers (one window), some or all of its layers."""
        cfg = self.model_config
        windows = {i: cfg.window_for(i) for i in range(cfg.num_hidden_layers)}
        layers = tuple(i for i, w in windows.items() if w is not None)
        if not layers:
            return None
        if len({windows[i] for i in layers}) != 1:
            raise ValueError("sliding-window layers with different windows: run --disable-hybrid-swa-memory")
        per_layer = bytes_per_token(1, kv_heads, cfg.head_dim, self.kv_dtype)
        full = cfg.num_hidden_layers - len(layers)
        return SlidingLayers(windows[layers[0]] or 0, layers, full * per_layer, len(layers) * per_layer)

    def device_row(self, row: int, n: int) -> list[int]:
        """The first `n` KV slots of a table row (for the scheduler's integrity check)."""
        return self.req_to_token[row, :n].tolist()

    # ---- one forward --------------------------------------------------------------------
    def forward_batch(self, fi: ForwardInput, staged: Staged | None = None) -> ForwardBatch:
        """Write the rows' new slots and tokens, and describe the forward for the model (its
        inputs from one staged upload: `engine/step_inputs.py`)."""
        if staged is None:
            staged = self._stage(fi)
        write_tables(staged, self.req_to_token, self.token_table, self.window)
        fb = forward_batch_of(fi, staged, self.req_to_token, self.token_table, self.kv, self.window)
        if self.padded_rows:
            fb = fb.padded(ROW_MULTIPLE)
        return fb

    def _stage(self, fi: ForwardInput) -> Staged:
        stage = stage_step(fi, self.model_config.vocab_size, with_sampling=self.tp.is_leader)
        return stage.upload(self.device)

    # ---- one forward, in three steps ---------------------------------------------------
    # `launch` (the model), `sample` (needs the vocab mask, which the overlap loop may
    # still be computing) and `collect` (the host copies). On the CPU they run back to back
    # (`run`); on CUDA the stream executor enqueues the first two and collects later.
    @torch.inference_mode()
    def run(self, fi: ForwardInput) -> ForwardOutput:
        """Forward and sample one batch; the sampled tokens go into the token table too."""
        launched = self.launch(fi)
        mask = fi.vocab_mask.result.result() if fi.vocab_mask is not None else None
        return self.collect(self.sample(launched, mask))

    @torch.inference_mode()
    def launch(self, fi: ForwardInput) -> LaunchedForward:
        with self._faults_of_the_group():
            return self._launch(fi)

    def sample(self, launched: LaunchedForward, mask: torch.Tensor | None) -> SampledForward:
        with self._faults_of_the_group():
            return self._sample(launched, mask)

    @contextlib.contextmanager
    def _faults_of_the_group(self) -> Iterator[None]:
        """With tensor parallelism a rank whose forward raised has left the others waiting in
        a collective: one batch cannot be dropped on one rank, so any fault is fatal."""
        try:
            yield
        except Exception as exc:
            if self.tp.size == 1 or isinstance(exc, EngineUnusable):
                raise
            raise EngineUnusable(f"tp rank {self.tp.rank}: {type(exc).__name__}: {exc}") from exc

    def _launch(self, fi: ForwardInput) -> LaunchedForward:
        began = time.perf_counter()
        staged = self._stage(fi)
        fb = self.forward_batch(fi, staged)
        if self.lora is not None:
            self.lora.prepare([(r.length, r.lora) for r in fi.rows])
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            logits = self.model.forward(fb)
        return LaunchedForward(fi, logits, began, staged)

    @torch.inference_mode()
    def _sample(self, launched: LaunchedForward, mask: torch.Tensor | None) -> SampledForward:
        fi, logits = launched.fi, launched.logits
        staged = launched.staged if launched.staged is not None else self._stage(fi)
        prompt = self._prompt_logprobs(fi, logits[len(fi.rows) :], staged)
        logits = logits[: len(fi.rows)]
        sampled = [r for r in fi.rows if r.sample]
        if not sampled:
            return SampledForward(launched, None, prompt)
        if len(sampled) < len(fi.rows):
            logits = logits.index_select(0, staged["sample_index"])
        rows_t, next_t = staged["sample_rows"], staged["next_pos"]
        if not self.tp.is_leader:  # rank 0 samples; its tokens go into every rank's table
            ids = torch.empty(len(sampled), dtype=torch.int64, device=self.device)
            self.tp.broadcast_tokens(ids)
            self.token_table[rows_t, next_t] = ids.to(self.token_table.dtype)
            return SampledForward(launched, SampleOutput(ids, None), prompt)  # no logprobs: rank 0's
        history = None
        if needs_history(fi.sampling):
            width = max(next_positions(fi))
            history = TokenHistory(self.token_table[rows_t, :width], next_t)
        tensors = SamplingTensors.of(staged, fi.sampling, self.model_config.vocab_size)
        out = sample(logits, fi.sampling, history, mask, tensors)
        self.tp.broadcast_tokens(out.token_ids)
        self.token_table[rows_t, next_t] = out.token_ids.to(self.token_table.dtype)
        return SampledForward(launched, out, prompt)

    def collect(self, sampled: SampledForward) -> ForwardOutput:
        """The host's copy of a sampled forward (waits for the device)."""
        fi, out = sampled.launched.fi, sampled.out
        prompt = sampled.prompt_logprobs
        prompt_logprobs = [v.tolist() for v in prompt] if prompt is not None else []
        elapsed = time.perf_counter() - sampled.launched.began
        if out is None:
            return ForwardOutput([], [], elapsed, [], prompt_logprobs)
        n = len(fi.sampling)
        logprobs: list[float | None] = out.logprobs.tolist() if out.logprobs is not None else [None] * n
        top: list[tuple[list[int], list[float]] | None] = [None] * n
        if out.top_ids is not None and out.top_logprobs is not None:
            ids, values = out.top_ids.tolist(), out.top_logprobs.tolist()
            for i, s in enumerate(fi.sampling):
                k = s.params.top_logprobs_num
                if k > 0:
                    top[i] = (ids[i][:k], values[i][:k])
        tokens = out.token_ids.tolist()
        return ForwardOutput(tokens, logprobs, time.perf_counter() - sampled.launched.began, top,
                             prompt_logprobs)  # fmt: skip

    def _prompt_logprobs(
        self, fi: ForwardInput, extra_logits: torch.Tensor, staged: Staged
    ) -> list[torch.Tensor] | None:
        """Per row, the logprob of each of its `logprob_targets` (None when no row asks)."""
        if not any(r.logprob_targets for r in fi.rows):
            return None
        targets = staged["logprob_targets"]
        n = sum(len(r.logprob_targets) for r in fi.rows)
        picked = torch.log_softmax(extra_logits[:n].float(), dim=-1)
        values = picked.gather(1, targets[:, None])[:, 0]
        out, at = [], 0
        for r in fi.rows:
            out.append(values[at : at + len(r.logprob_targets)])
            at += len(r.logprob_targets)
        return out


@dataclass(frozen=True)
class LaunchedForward:
    fi: ForwardInput
    logits: torch.Tensor  # the model's, on the device
    began: float
    staged: Staged | None = None  # the step's uploaded inputs (sampling reads them too)


@dataclass(frozen=True)
class SampledForward:
    launched: LaunchedForward
    out: SampleOutput | None  # None: nothing sampled (intermediate chunks only)
    prompt_logprobs: list[torch.Tensor] | None
