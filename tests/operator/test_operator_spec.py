"""parse_spec: defaults, model sources, and rejection of every rule the operator relies on."""

from __future__ import annotations

import pytest
from invalid_cases import INVALID_CASES
from operator_testkit import IMAGE

from sluice.operator.parsing import SpecError, abbreviates, parse_spec
from sluice.operator.spec import (
    Autoscaling,
    MetricTarget,
    ModelSource,
    NetworkPolicy,
    PodOptions,
    Resources,
    RuntimeOptions,
    ScalingRules,
    SecretKeyRef,
)


def test_minimal_spec_gets_the_documented_defaults(make_spec):
    isvc = make_spec()

    assert isvc.image == IMAGE
    assert isvc.replicas == 1
    assert isvc.resources == Resources(gpus=0, gpu_resource="nvidia.com/gpu", cpu=None, memory=None)
    assert isvc.resources.device == "cpu"
    assert isvc.runtime == RuntimeOptions(tensor_parallel_size=1, overlap_schedule=True)
    assert isvc.autoscaling == Autoscaling(
        enabled=False,
        min_replicas=1,
        max_replicas=4,
        metrics=(MetricTarget("queueDepth", 2.0),),
        scale_up=ScalingRules(0),
        scale_down=ScalingRules(300),
    )
    assert isvc.startup_timeout_seconds == 1800
    assert isvc.termination_grace_period_seconds == 120
    assert isvc.model.source == ModelSource(
        uri="bundled://smollm2-135m", scheme="bundled", path="smollm2-135m"
    )
    assert isvc.model.served_name == "SmolLM2-135M-Instruct"


def test_the_second_bundled_model_is_gemma3_270m(make_spec):
    from sluice.operator.builders.model import model_mount

    isvc = make_spec(model={"source": "bundled://gemma3-270m"})

    assert isvc.model.source.scheme == "bundled"
    assert isvc.model.served_name == "gemma-3-270m"
    assert model_mount(isvc, {}).model_argument == "gemma3-270m"


def test_hf_source_names_the_repo_and_defaults_the_token_key(make_spec):
    isvc = make_spec(
        model={"source": "hf://Qwen/Qwen2.5-7B-Instruct", "tokenSecretRef": {"name": "hf"}}
    )

    assert isvc.model.source.repo == "Qwen/Qwen2.5-7B-Instruct"
    assert isvc.model.served_name == "Qwen/Qwen2.5-7B-Instruct"
    assert isvc.model.token_secret == SecretKeyRef(name="hf", key="HF_TOKEN")


@pytest.mark.parametrize(
    ("source", "claim", "path", "served"),
    [
        ("pvc://models/llama/Llama-3.1-8B", "models", "llama/Llama-3.1-8B", "Llama-3.1-8B"),
        (
            "pvc://models/gguf/qwen2-0.5b-q8_0.gguf",
            "models",
            "gguf/qwen2-0.5b-q8_0.gguf",
            "qwen2-0.5b-q8_0",
        ),
        ("pvc://weights", "weights", "", "weights"),
    ],
)
def test_pvc_source_splits_claim_and_path(make_spec, source, claim, path, served):
    isvc = make_spec(model={"source": source})

    assert (isvc.model.source.claim, isvc.model.source.path) == (claim, path)
    assert isvc.model.served_name == served


def test_explicit_served_name_and_image_win(make_spec):
    isvc = make_spec(model={"source": "hf://org/m", "servedName": "my-model"}, image="mine:2")

    assert isvc.model.served_name == "my-model"
    assert isvc.image == "mine:2"


def test_tensor_parallel_size_defaults_to_the_gpus_of_a_replica(make_spec):
    assert make_spec(resources={"gpus": 4}).runtime.tensor_parallel_size == 4
    assert make_spec(resources={"gpus": 0}).runtime.tensor_parallel_size == 1
    assert make_spec(runtime={"tensorParallelSize": 2}).runtime.tensor_parallel_size == 2  # CPU


def test_drain_timeout_is_the_grace_period_less_prestop_and_exit_margin(make_spec):
    assert make_spec().drain_timeout_seconds == 120 - 5 - 5
    assert make_spec(terminationGracePeriodSeconds=300).drain_timeout_seconds == 290
    assert make_spec(terminationGracePeriodSeconds=15).drain_timeout_seconds == 5


def test_an_autoscaled_deployment_starts_within_the_autoscaling_bounds(make_spec):
    scaling = {"enabled": True, "minReplicas": 2, "maxReplicas": 5}
    assert make_spec(replicas=1, autoscaling=scaling).autoscaled_start_replicas == 2
    assert make_spec(replicas=3, autoscaling=scaling).autoscaled_start_replicas == 3
    assert make_spec(replicas=9, autoscaling=scaling).autoscaled_start_replicas == 5


@pytest.mark.parametrize(
    ("arg", "managed"),
    [
        ("--port=8081", "--port"),
        ("--por=8081", "--port"),
        ("--hos", "--host"),
        ("--devic=cuda", "--device"),
        ("--d", "--device"),  # ambiguous for argparse, still refused
        ("--", "--model"),  # ends the options: what follows would be positional
        ("--max-total-tokens=4096", None),
        ("--model-cache-dir=/x", None),  # longer than --model: a different flag
        ("cuda", None),
        ("-p", None),
    ],
)
def test_extra_args_are_checked_as_argparse_would_read_them(arg, managed):
    assert abbreviates(arg) == managed


def test_one_literal_file_is_loaded_as_a_file(make_spec):
    gguf = make_spec(model={"source": "hf://org/m-GGUF", "files": ["m-q4_k_m.gguf"]})
    assert gguf.model.single_file == "m-q4_k_m.gguf"
    assert make_spec(model={"source": "hf://org/m", "files": ["*.gguf"]}).model.single_file is None
    assert make_spec(model={"source": "hf://org/m"}).model.single_file is None


def test_pod_options_and_network_policy_are_read(make_spec):
    isvc = make_spec(
        serviceAccountName="inference",
        imagePullSecrets=[{"name": "regcred"}],
        podMetadata={"labels": {"team": "ml"}, "annotations": {"sidecar.istio.io/inject": "false"}},
        networkPolicy={"enabled": True, "allowedNamespaces": ["apps"]},
    )
    assert isvc.pod == PodOptions(
        service_account_name="inference",
        image_pull_secrets=("regcred",),
        labels={"team": "ml"},
        annotations={"sidecar.istio.io/inject": "false"},
    )
    assert isvc.network_policy == NetworkPolicy(True, ("apps",), "monitoring")


@pytest.mark.parametrize(
    ("case", "name", "spec", "message"), INVALID_CASES, ids=[c[0] for c in INVALID_CASES]
)
def test_invalid_spec_is_rejected_with_its_reason(case, name, spec, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(name, "default", spec, default_image=IMAGE)

    assert any(message in problem for problem in caught.value.problems), caught.value.problems


def test_all_problems_are_reported_at_once():
    spec = {"model": {"source": "nope"}, "replicas": -1, "runtime": {"dtype": "int8"}}

    with pytest.raises(SpecError) as caught:
        parse_spec("chat", "default", spec, default_image=IMAGE)

    fields = [problem.split(":")[0] for problem in caught.value.problems]
    assert fields == ["spec.model.source", "spec.replicas", "spec.runtime.dtype"]


def test_spec_that_is_not_an_object_is_rejected():
    with pytest.raises(SpecError, match="spec: must be an object"):
        parse_spec("chat", "default", ["model"], default_image=IMAGE)  # type: ignore[arg-type]
