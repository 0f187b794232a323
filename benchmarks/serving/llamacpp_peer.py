"""The llama.cpp peer: llama-cpp-python's low-level API, every request at once.

All requests are sequences of one llama.cpp context (`n_seq_max` = requests, unified KV):
their prompts are prefilled through `llama_decode` in batches of `N_BATCH` tokens, then
each step decodes one token for every sequence still running, greedily, each sequence
stopping at its own output length (continuous batching, as the server does). Two models:
`llamacpp` is the bundled GGUF as shipped (Q4_1 for SmolLM2, Q4_K_M for Gemma 3 270M), `llamacpp-q8_0` a Q8_0
re-quantization of it made once by llama.cpp's own `llama_model_quantize` into the cache.

llama-cpp-python is not a project dependency: install it in the benchmark environment
once, built for this CPU (about 3 minutes):

    CMAKE_ARGS="-DGGML_NATIVE=ON" .venv/bin/pip install llama-cpp-python==0.3.36

It never runs in `make test`.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.serving.dataset import BenchRequest
from benchmarks.serving.metrics import PeerBatch

LLAMACPP_PEERS = ("llamacpp", "llamacpp-q8_0")
N_BATCH = 2048
INSTALL_HINT = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36'


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (missing package or a model that is not GGUF)."""


_QUIET = None  # the log callback, kept alive while llama.cpp may call it


def _llama_cpp():
    global _QUIET
    try:
        import llama_cpp
    except ImportError as err:
        raise PeerUnavailable(f"llama-cpp-python is not installed ({INSTALL_HINT})") from err
    if _QUIET is None:  # llama.cpp logs every tensor it loads or converts: keep errors only

        @llama_cpp.llama_log_callback
        def quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            if level >= 4 and level != 5:  # GGML_LOG_LEVEL_ERROR (4); 5 is CONT
                print(text.decode(errors="replace"), end="")

        _QUIET = quiet
        llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())
    return llama_cpp


def source_gguf(model: str) -> Path:
    """The GGUF behind `--model`: the bundled model's file, or a .gguf path."""
    from sluice.runtime import constants

    if model in (constants.BUNDLED_MODEL_NAME, constants.BUNDLED_MODEL_URI):
        from sluice.runtime.model.loader import bundled_gguf_path

        return bundled_gguf_path()
    if model in (constants.BUNDLED_GEMMA3_NAME, constants.BUNDLED_GEMMA3_URI):
        from sluice.runtime.cache_dir import default_cache_dir
        from sluice.runtime.model.loader import bundled_gemma3_gguf_path

        return bundled_gemma3_gguf_path(default_cache_dir())
    if model.endswith(".gguf") and Path(model).is_file():
        return Path(model)
    raise PeerUnavailable(f"the llama.cpp peers need a GGUF model, not {model!r}")


def gguf_for(name: str, model: str, cache_dir: Path | None) -> Path:
    """The GGUF file peer `name` runs: the source, or its Q8_0 re-quantization (made once)."""
    source = source_gguf(model)
    if name == "llamacpp":
        return source
    if name != "llamacpp-q8_0":
        raise ValueError(f"unknown llama.cpp peer {name!r}")
    from sluice.runtime.cache_dir import default_cache_dir

    target = (cache_dir or default_cache_dir()) / "llamacpp" / f"{source.stem}.requant-Q8_0.gguf"
    if target.is_file():
        return target
    llama_cpp = _llama_cpp()
    target.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    tmp = target.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize to Q8_0 failed with {rc}")
    tmp.rename(target)
    return target


def run_llamacpp_peer(
    gguf: Path,
    requests: Sequence[BenchRequest],
    threads: int,
    log: Callable[[str], None] = print,
) -> list[PeerBatch]:
    """Run every request at once; one `PeerBatch` per request, ending when it finished."""
    import numpy as np

    llama_cpp = _llama_cpp()
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def tokenize(text: str) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 16))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
        if n < 0:
            raise RuntimeError("llama_tokenize: buffer too small")
        return list(buf[:n])

    prompts = [tokenize(r.prompt) for r in requests]
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = sum(len(p) + r.output_len for p, r in zip(prompts, requests, strict=True)) + 256
    params.n_batch = N_BATCH
    params.n_ubatch = 512
    params.n_seq_max = len(requests)
    params.n_threads = params.n_threads_batch = threads
    if hasattr(params, "kv_unified"):
        params.kv_unified = True
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create the context")
    batch = llama_cpp.llama_batch_init(max(N_BATCH, len(requests)), 0, 1)

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(items)
        for i, (token, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        if (rc := llama_cpp.llama_decode(ctx, batch)) != 0:
            raise RuntimeError(f"llama_decode failed with {rc}")

    def greedy(i: int) -> int:
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
        return int(row.argmax())

    log(f"peer: llama.cpp {gguf.name}, {len(requests)} sequences in one context, {threads} threads")
    done: list[PeerBatch] = []
    last = [0] * len(requests)
    made = [0] * len(requests)
    try:
        # warm-up off the clock (graph allocation, first-touch of the weights), then forget it
        decode([(t, pos, 0, pos == len(prompts[0]) - 1) for pos, t in enumerate(prompts[0])])
        decode([(greedy(len(prompts[0]) - 1), len(prompts[0]), 0, True)])
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        start = time.perf_counter()
        pending = [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts)
                   for pos, t in enumerate(p)]  # fmt: skip
        for at in range(0, len(pending), N_BATCH):
            chunk = pending[at : at + N_BATCH]
            decode(chunk)
            for i, (_, _, seq, logits) in enumerate(chunk):
                if logits:
                    last[seq], made[seq] = greedy(i), 1
        running = list(range(len(requests)))
        while True:
            now = time.perf_counter() - start
            for seq in [s for s in running if made[s] >= requests[s].output_len]:
                done.append(PeerBatch((requests[seq].prompt_len,), (requests[seq].output_len,),
                                      requests[seq].output_len, now))  # fmt: skip
            running = [s for s in running if made[s] < requests[s].output_len]
            if not running:
                break
            decode([(last[s], len(prompts[s]) + made[s] - 1, s, True) for s in running])
            for i, s in enumerate(running):
                last[s] = greedy(i)
                made[s] += 1
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    log(f"  llama.cpp done at {max(b.end_s for b in done):.1f}s")
    return done
