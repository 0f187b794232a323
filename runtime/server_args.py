"""Every tunable of `sluice serve`, in one place.

`ServerArgs` is a frozen dataclass built once from the command line and handed down; no
component reads flags from globals or the environment. Each field's metadata carries its
one-line help text, and the argparse parser is generated from the fields, so a flag is
declared exactly once.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime import constants as C


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class ServerArgs:
    model: str = _opt(
        C.BUNDLED_MODEL_NAME,
        "Hugging Face model folder, GGUF file, or the bundled model's name "
        f"('{C.BUNDLED_MODEL_NAME}').",
    )
    served_model_name: str = _opt("", "Model name reported by /v1/models (default: derived).")
    host: str = _opt(C.DEFAULT_HOST, "Address the HTTP server binds.")
    port: int = _opt(C.DEFAULT_PORT, "Port the HTTP server listens on.")
    device: str = _opt("auto", "Device for the model: cpu, cuda or auto.", ("auto", "cpu", "cuda"))
    dtype: str = _opt("auto", "Weight and activation dtype (auto: fp32 on CPU, bf16 on GPU).", C.DTYPES)
    page_size: int = _opt(1, "Tokens per KV cache page.")
    max_total_tokens: int = _opt(0, "KV pool size in tokens (0: derive from the memory budget).")
    cpu_kv_cache_gib: float = _opt(1.0, "KV pool budget in GiB on the CPU when --max-total-tokens is 0.")
    mem_fraction_static: float = _opt(
        0.85, "Fraction of GPU memory for weights plus KV pool (GPU only)."
    )
    max_running_requests: int = _opt(64, "Request slots: most requests decoding at once.")
    max_prefill_tokens: int = _opt(8192, "Most prompt tokens admitted into one prefill batch.")
    chunked_prefill_size: int = _opt(
        2048, "Longest prompt piece prefilled in one tick; longer prompts are chunked (-1: off)."
    )
    max_context_len: int = _opt(0, "Context length limit (0: the model's own).")
    schedule_policy: str = _opt("fcfs", "Order in which waiting requests are admitted.", C.SCHEDULE_POLICIES)
    retraction_policy: str = _opt(
        "length", "Which running requests to retract first when the KV pool runs out "
        "(length: fewest generated tokens, then longest prompt; newest: latest arrival).",
        ("length", "newest"),
    )
    init_new_token_ratio: float = _opt(
        0.7, "Initial share of max_new_tokens a running request is expected to still use."
    )
    schedule_conservativeness: float = _opt(
        1.0, "Scales --init-new-token-ratio: >1 admits fewer requests (fewer retractions)."
    )
    disable_radix_cache: bool = _opt(False, "Turn off prefix sharing through the radix cache.")
    in_batch_prefix_check_threshold: int = _opt(
        32, "lpm: below this cached-prefix length a request is checked for in-batch sharing."
    )
    in_batch_prefix_deprioritize_threshold: int = _opt(
        32, "lpm: a request sharing at least this many tokens with an earlier one waits a tick."
    )
    disable_overlap_schedule: bool = _opt(
        False, "Use the normal loop: process each batch's result before scheduling the next.",
    )
    log_tick_timing: float = _opt(
        0.0, "Every this many seconds, log where scheduler time went per tick (0: off).",
    )
    enable_deterministic_inference: bool = _opt(
        False, "Batch-invariant kernels: a request's tokens do not depend on its batch "
        "(retraction, chunking and concurrency cannot change an output). Slower.",
    )
    tensor_parallel_size: int = _opt(
        1, "GPUs one model replica is sharded over (this build runs 1; more is rejected)."
    )
    attention_backend: str = _opt("auto", "Attention implementation.", C.ATTENTION_BACKENDS)
    api_key: str = _opt("", f"Require this bearer token on the API (also ${C.ENV_API_KEY}).")
    random_seed: int = _opt(0, "Seed for requests that give none.")
    disable_warmup: bool = _opt(False, "Skip the warm-up generation before /health turns 200.")
    log_level: str = _opt("info", "Log level.", ("debug", "info", "warning", "error"))
    model_cache_dir: str = _opt("", "Where converted models are cached (default ~/.cache/sluice).")
    drain_timeout: float = _opt(30.0, "Seconds SIGTERM waits for running requests to finish.")
    torch_threads: int = _opt(0, "torch intra-op threads in the scheduler on the CPU (0: torch's default).")

    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def chunk_size(self) -> int:
        """Largest prompt piece per tick; `max_prefill_tokens` bounds it too."""
        if self.chunked_prefill_size <= 0:
            return self.max_prefill_tokens
        return min(self.chunked_prefill_size, self.max_prefill_tokens)

    def validate(self) -> None:
        problems = []
        if self.page_size < 1:
            problems.append("--page-size must be >= 1")
        if self.max_running_requests < 1:
            problems.append("--max-running-requests must be >= 1")
        if self.max_prefill_tokens < 1:
            problems.append("--max-prefill-tokens must be >= 1")
        if self.max_total_tokens < 0:
            problems.append("--max-total-tokens must be >= 0")
        if not 0.0 < self.mem_fraction_static < 1.0:
            problems.append("--mem-fraction-static must be in (0, 1)")
        if self.tensor_parallel_size != 1:
            problems.append(
                "--tensor-parallel-size > 1 is not supported by this build yet; "
                "run one replica per GPU"
            )
        if problems:
            raise ValueError("; ".join(problems))

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            help_text = f.metadata["help"]
            if f.type in ("bool", bool):
                parser.add_argument(flag, action="store_true", help=help_text)
                continue
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            parser.add_argument(
                flag,
                type=kind,
                default=f.default,
                choices=f.metadata["choices"],
                help=f"{help_text} (default: {f.default!r})",
            )

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}
        if not values["api_key"]:
            values["api_key"] = os.environ.get(C.ENV_API_KEY, "")
        args = cls(**values)
        args.validate()
        return args
