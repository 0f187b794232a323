"""`GrammarCompiler`: constraints compiled against one tokenizer, off the hot path, cached.

Compilation (seconds for a large schema on a big vocabulary, milliseconds for most) runs
on a small thread pool; xgrammar releases the GIL while it works. Results are cached per
(kind, spec, strict) in an LRU of futures, so concurrent requests with one schema share a
single compilation, and a failed compilation is cached too (it fails the same way again).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sluice.runtime.constrained.spec import (
    GrammarError,
    grammar_library,
    grammar_of,
    library_reason,
)
from sluice.runtime.ipc.messages import Constraint


@dataclass(frozen=True)
class GrammarConfig:
    json_any_whitespace: bool = False  # see spec.grammar_of
    compile_threads: int = 2
    cache_entries: int = 1024  # compiled grammars kept (LRU)


@dataclass(frozen=True)
class CompiledGrammar:
    """A constraint compiled for this tokenizer; shareable by any number of matchers."""

    constraint: Constraint
    compiled: Any  # xgrammar.CompiledGrammar
    compile_seconds: float


class GrammarCompiler:
    """Compiles `Constraint`s for one tokenizer and model vocabulary.

    `vocab_size`: the model's logits width (config.vocab_size), which may exceed the
    tokenizer's length (padded embeddings; the extra ids are never allowed) or fall short
    of it (ids past it cannot be sampled, so they are dropped).
    `stop_token_ids`: the ids that end the request (EOS and the generation config's); a
    matcher allows them exactly when the grammar is complete.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        config: GrammarConfig | None = None,
    ) -> None:
        self.config = config or GrammarConfig()
        self.vocab_size = vocab_size
        self.stop_token_ids = [t for t in dict.fromkeys(stop_token_ids) if t < vocab_size]
        self._tokenizer = tokenizer
        self._library: tuple[Any, Any] | None = None  # (TokenizerInfo, xgrammar's compiler)
        self._pool = ThreadPoolExecutor(self.config.compile_threads, "grammar-compile")
        self._cache: OrderedDict[Constraint, Future[CompiledGrammar]] = OrderedDict()
        self._lock = threading.Lock()
        self._library_lock = threading.Lock()

    def compile_async(self, constraint: Constraint) -> Future[CompiledGrammar]:
        """A future of the compiled grammar (cached); its exception is a GrammarError."""
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None:
                self._cache.move_to_end(constraint)
                return future
            future = self._pool.submit(self._compile, constraint)
            self._cache[constraint] = future
            while len(self._cache) > self.config.cache_entries:
                self._cache.popitem(last=False)
            return future

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Blocking `compile_async`; raises GrammarError."""
        return self.compile_async(constraint).result()

    @property
    def tokenizer_info(self) -> Any:
        return self._xgrammar("output")[0]

    def _xgrammar(self, kind: str) -> tuple[Any, Any]:
        """xgrammar's tokenizer info and compiler, built at the first constraint (a server
        without xgrammar starts, and refuses constrained requests: GrammarUnavailable)."""
        with self._library_lock:
            if self._library is None:
                xgr = grammar_library(kind)
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids or None,
                )  # fmt: skip
                compiler = xgr.GrammarCompiler(
                    info, max_threads=self.config.compile_threads, cache_enabled=False
                )
                self._library = (info, compiler)
            return self._library

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        start = time.perf_counter()
        grammar = grammar_of(constraint, self.config.json_any_whitespace)
        xgr_compiler = self._xgrammar(constraint.kind)[1]
        try:
            compiled = xgr_compiler.compile_grammar(grammar)
        except Exception as exc:
            raise GrammarError(constraint.kind, library_reason(exc)) from exc
        return CompiledGrammar(constraint, compiled, time.perf_counter() - start)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
