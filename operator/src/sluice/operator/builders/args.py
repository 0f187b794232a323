"""The `sluice serve` command line for an InferenceService."""

from __future__ import annotations

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .model import lora_path


def serve_command() -> list[str]:
    return list(rc.SERVE_COMMAND)


def serve_args(isvc: InferenceServiceSpec, model_argument: str) -> list[str]:
    """Flags from `spec.runtime`; unset options are left to the runtime's own defaults."""
    rt = isvc.runtime
    args = [
        rc.FLAG_MODEL,
        model_argument,
        rc.FLAG_SERVED_MODEL_NAME,
        isvc.model.served_name,
        rc.FLAG_HOST,
        c.BIND_HOST,
        rc.FLAG_PORT,
        str(rc.DEFAULT_PORT),
        rc.FLAG_DEVICE,
        isvc.resources.device,
        rc.FLAG_TENSOR_PARALLEL_SIZE,
        str(rt.tensor_parallel_size),
        rc.FLAG_STARTUP_TIMEOUT,
        str(isvc.startup_timeout_seconds),
        rc.FLAG_DRAIN_TIMEOUT,
        str(isvc.drain_timeout_seconds),
    ]
    optional: list[tuple[str, object]] = [
        (rc.FLAG_DTYPE, rt.dtype),
        (rc.FLAG_PAGE_SIZE, rt.page_size),
        (rc.FLAG_MAX_RUNNING_REQUESTS, rt.max_running_requests),
        (rc.FLAG_CHUNKED_PREFILL_SIZE, rt.chunked_prefill_size),
        (rc.FLAG_SCHEDULE_POLICY, rt.schedule_policy),
        (rc.FLAG_MEM_FRACTION_STATIC, rt.mem_fraction_static),
        (rc.FLAG_ATTENTION_BACKEND, rt.attention_backend),
    ]
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    if not rt.overlap_schedule:
        args.append(rc.FLAG_DISABLE_OVERLAP_SCHEDULE)
    threads = isvc.resources.cpu_threads
    if isvc.resources.device == "cpu" and threads is not None:
        # torch would run one thread per core of the node; the pod pays for `cpu` cores
        # (a flag in extraArgs, later on the line, wins)
        args += [rc.FLAG_TORCH_THREADS, str(threads)]
    if isvc.role is not None:  # a P/D pool's server
        args += [rc.FLAG_DISAGGREGATION_MODE, isvc.role]
        if isvc.role == c.ROLE_PREFILL:
            args += [rc.FLAG_DISAGGREGATION_BOOTSTRAP_PORT, str(isvc.disaggregation.bootstrap_port)]
    if isvc.inference_pool.enabled:  # the endpoint picker reads vLLM's metric names
        args += [rc.FLAG_METRICS_COMPAT, c.METRICS_COMPAT_VLLM]
    lora = isvc.model.lora
    if lora is not None and lora.adapters:
        args += [rc.FLAG_ENABLE_LORA, rc.FLAG_LORA_MODULES]
        args += [f"{a.name}={lora_path(a)}" for a in lora.adapters]
        if lora.max_adapters is not None:
            args += [rc.FLAG_MAX_LORAS, str(lora.max_adapters)]
        if lora.max_rank is not None:
            args += [rc.FLAG_MAX_LORA_RANK, str(lora.max_rank)]
        # every listed adapter stays in host memory (none is read again from disk)
        args += [rc.FLAG_MAX_CPU_LORAS, str(max(len(lora.adapters), lora.max_adapters or 1))]
    return args + list(rt.extra_args)
