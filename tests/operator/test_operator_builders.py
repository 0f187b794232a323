"""Builders: given specs → exact child objects."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from operator_testkit import IMAGE
from operator_validators import k8s_validate

from sluice.operator.builders import (
    build_deployment,
    build_hpa,
    build_networkpolicy,
    build_pdb,
    build_podmonitor,
    build_service,
)
from sluice.operator.builders.args import serve_args
from sluice.operator.builders.common import selector_string, to_quantity
from sluice.operator.builders.model import DOWNLOAD_SCRIPT
from sluice.operator.children import plan
from sluice.operator.kube import HPAS, NETWORKPOLICIES, PODMONITORS

LABELS = {
    "app.kubernetes.io/name": "sluice-runtime",
    "app.kubernetes.io/instance": "chat",
    "app.kubernetes.io/component": "inference",
    "app.kubernetes.io/part-of": "sluice",
    "app.kubernetes.io/managed-by": "sluice-operator",
}
SELECTOR = {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/instance": "chat"}
META = {"name": "chat", "namespace": "default", "labels": LABELS}
SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


def probe(period: int, failures: int, path: str = "/health") -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


@pytest.mark.parametrize(
    ("resources", "threads"),
    [
        ({"cpu": "2"}, "2"),
        ({"cpu": "500m"}, "1"),
        ({"cpu": "2500m"}, "3"),  # rounded up: a pool narrower than the request idles a core
        ({}, None),  # no request: torch's default
        ({"cpu": "8", "gpus": 1}, None),  # a GPU pod: the model does not run on the CPU
    ],
)
def test_cpu_pods_run_as_many_torch_threads_as_they_request(make_spec, resources, threads):
    args = serve_args(make_spec(resources=resources), "/models/x")
    if threads is None:
        assert "--torch-threads" not in args
    else:
        assert args[args.index("--torch-threads") + 1] == threads


def test_torch_threads_in_extra_args_win(make_spec):
    isvc = make_spec(resources={"cpu": "2"}, runtime={"extraArgs": ["--torch-threads=4"]})
    args = serve_args(isvc, "/models/x")
    assert args.index("--torch-threads") < args.index("--torch-threads=4")  # the last one wins
    from sluice.runtime.cli import build_parser  # the runtime's own parser is the oracle

    assert build_parser().parse_args(["serve", *args]).torch_threads == 4


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        ({}, {"maxSurge": 1, "maxUnavailable": 0}),  # never a serving pod down first
        ({"maxSurge": 0, "maxUnavailable": 1}, {"maxSurge": 0, "maxUnavailable": 1}),
        (
            {"maxSurge": "25%", "maxUnavailable": "10%"},
            {"maxSurge": "25%", "maxUnavailable": "10%"},
        ),
    ],
)
def test_the_rollout_strategy_is_the_specs(make_spec, rollout, expected):
    isvc = make_spec(resources={"gpus": 8}, rollout=rollout)
    deployment = build_deployment(isvc)
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": expected}
    k8s_validate(deployment)


def test_cpu_bundled_deployment_is_exactly_this(make_spec):
    isvc = make_spec(resources={"cpu": "2", "memory": "2Gi"})

    assert build_deployment(isvc) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**META, "annotations": {"sluice.dev/spec-replicas": "1"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": SELECTOR},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 2400,
            "template": {
                "metadata": {
                    "labels": LABELS,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "30000",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "fsGroupChangePolicy": "OnRootMismatch",
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationGracePeriodSeconds": 120,
                    "containers": [
                        {
                            "name": "runtime",
                            "image": IMAGE,
                            "command": ["sluice", "serve"],
                            "args": [
                                "--model",
                                "smollm2-135m",
                                "--served-model-name",
                                "SmolLM2-135M-Instruct",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "30000",
                                "--device",
                                "cpu",
                                "--tensor-parallel-size",
                                "1",
                                "--startup-timeout",
                                "1800",
                                "--drain-timeout",
                                "110",
                                "--torch-threads",  # the 2 CPUs requested, not the node's
                                "2",
                            ],
                            "ports": [{"name": "http", "containerPort": 30000, "protocol": "TCP"}],
                            "env": [
                                {"name": "XDG_CACHE_HOME", "value": "/var/cache/sluice"},
                                {"name": "HF_HOME", "value": "/var/cache/sluice/huggingface"},
                            ],
                            "resources": {
                                "requests": {"cpu": "2", "memory": "2Gi"},
                                "limits": {"memory": "2Gi"},
                            },
                            "startupProbe": probe(10, 180),
                            "readinessProbe": probe(5, 3),
                            "livenessProbe": probe(10, 6, "/health/live"),
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
                            "volumeMounts": [
                                {"name": "cache", "mountPath": "/var/cache/sluice"},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                            "securityContext": SECURITY,
                        }
                    ],
                    "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": SELECTOR},
                            "matchLabelKeys": ["pod-template-hash"],
                        }
                    ],
                },
            },
        },
    }


def test_gpu_hf_deployment_downloads_first_and_requests_gpus(make_spec):
    isvc = make_spec(
        model={
            "source": "hf://Qwen/Qwen2.5-14B-Instruct",
            "revision": "v2",
            "tokenSecretRef": {"name": "hf"},
            "storageSize": "40Gi",
        },
        resources={"gpus": 2, "memory": "64Gi"},
        runtime={"tensorParallelSize": 2, "dtype": "bfloat16"},
        env=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
    )
    pod = build_deployment(isvc)["spec"]["template"]["spec"]
    container = pod["containers"][0]

    assert pod["initContainers"] == [
        {
            "name": "model-download",
            "image": IMAGE,
            "command": ["python", "-c", DOWNLOAD_SCRIPT],
            "env": [
                {"name": "SLUICE_MODEL_REPO", "value": "Qwen/Qwen2.5-14B-Instruct"},
                {"name": "SLUICE_MODEL_DIR", "value": "/models/hf"},
                {"name": "HF_HOME", "value": "/tmp/huggingface"},
                {"name": "SLUICE_MODEL_REVISION", "value": "v2"},
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}},
                },
                {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},  # the download's too
            ],
            "volumeMounts": [
                {"name": "model", "mountPath": "/models"},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
            "securityContext": SECURITY,
            "resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "64Gi"}},
        }
    ]
    assert container["resources"] == {
        "requests": {"memory": "64Gi", "nvidia.com/gpu": "2", "ephemeral-storage": "40Gi"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
    }
    assert container["args"][:12] == [
        "--model",
        "/models/hf",
        "--served-model-name",
        "Qwen/Qwen2.5-14B-Instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--device",
        "cuda",
        "--tensor-parallel-size",
        "2",
    ]
    assert pod["volumes"] == [
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "model", "emptyDir": {"sizeLimit": "40Gi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
    ]
    assert container["volumeMounts"] == [
        {"name": "cache", "mountPath": "/var/cache/sluice"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "model", "mountPath": "/models", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def test_download_script_takes_its_arguments_from_the_environment():
    assert 'os.environ["SLUICE_MODEL_REPO"]' in DOWNLOAD_SCRIPT
    compile(DOWNLOAD_SCRIPT, "<download>", "exec")  # valid Python


def test_pvc_model_is_mounted_read_only(make_spec):
    isvc = make_spec(model={"source": "pvc://models/gguf/qwen.gguf"})
    pod = build_deployment(isvc)["spec"]["template"]["spec"]

    assert "initContainers" not in pod
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in pod["volumes"]
    assert {"name": "model", "mountPath": "/models/pvc", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    assert pod["containers"][0]["args"][:4] == [
        "--model",
        "/models/pvc/gguf/qwen.gguf",
        "--served-model-name",
        "qwen",
    ]


def test_no_shm_volume_without_tensor_parallelism(make_spec):
    pod = build_deployment(make_spec(resources={"gpus": 1}))["spec"]["template"]["spec"]
    assert all(volume["name"] != "dshm" for volume in pod["volumes"])


def test_runtime_options_become_flags_in_order(make_spec):
    isvc = make_spec(
        runtime={
            "dtype": "float32",
            "pageSize": 16,
            "maxRunningRequests": 32,
            "chunkedPrefillSize": 2048,
            "schedulePolicy": "lpm",
            "memFractionStatic": 0.85,
            "attentionBackend": "torch",
            "overlapSchedule": False,
            "extraArgs": ["--max-total-tokens=4096"],
        }
    )

    assert serve_args(isvc, "smollm2-135m")[16:] == [
        "--dtype",
        "float32",
        "--page-size",
        "16",
        "--max-running-requests",
        "32",
        "--chunked-prefill-size",
        "2048",
        "--schedule-policy",
        "lpm",
        "--mem-fraction-static",
        "0.85",
        "--attention-backend",
        "torch",
        "--disable-overlap-schedule",
        "--max-total-tokens=4096",
    ]


def test_api_key_comes_from_a_secret_and_user_env_follows(make_spec):
    isvc = make_spec(
        runtime={"apiKeySecretRef": {"name": "keys"}},
        env=[{"name": "LOG_LEVEL", "value": "debug"}],
    )
    env = build_deployment(isvc)["spec"]["template"]["spec"]["containers"][0]["env"]

    assert env[2:] == [
        {
            "name": "SLUICE_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "keys", "key": "SLUICE_API_KEY"}},
        },
        {"name": "LOG_LEVEL", "value": "debug"},
    ]
    assert (
        "--api-key"
        not in build_deployment(isvc)["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_scheduling_is_copied_to_the_pod(make_spec):
    scheduling = {
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "priorityClassName": "inference",
        "runtimeClassName": "nvidia",
    }
    pod = build_deployment(make_spec(scheduling=copy.deepcopy(scheduling)))["spec"]["template"][
        "spec"
    ]

    assert {key: pod[key] for key in scheduling} == scheduling


def test_built_objects_do_not_alias_the_spec(make_spec):
    isvc = make_spec(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    first = build_deployment(isvc)
    first["spec"]["template"]["spec"]["containers"][0]["env"][-1]["valueFrom"]["fieldRef"][
        "fieldPath"
    ] = "x"

    assert build_deployment(isvc)["spec"]["template"]["spec"]["containers"][0]["env"][-1][
        "valueFrom"
    ] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_startup_probe_allows_the_startup_timeout(make_spec):
    container = build_deployment(make_spec(startupTimeoutSeconds=605))["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert (
        container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"]
        >= 605
    )


def test_autoscaled_deployment_leaves_replicas_to_the_hpa(make_spec):
    isvc = make_spec(replicas=3, autoscaling={"enabled": True})
    assert "replicas" not in build_deployment(isvc)["spec"]


def test_service_is_exactly_this(make_spec):
    assert build_service(make_spec()) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": META,
        "spec": {
            "type": "ClusterIP",
            "selector": SELECTOR,
            "ports": [
                {
                    "name": "http",
                    "port": 80,
                    "targetPort": "http",
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def test_hpa_is_exactly_this(make_spec):
    isvc = make_spec(
        autoscaling={
            "enabled": True,
            "minReplicas": 2,
            "maxReplicas": 6,
            "metrics": [
                {"type": "queueDepth", "target": 4},
                {"type": "kvTokenUsage", "target": 0.8},
            ],
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                }
            },
        }
    )

    assert build_hpa(isvc) == {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": META,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
            "minReplicas": 2,
            "maxReplicas": 6,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "sluice_queue_requests"},
                        "target": {"type": "AverageValue", "averageValue": "4"},
                    },
                },
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "sluice_kv_token_usage"},
                        "target": {"type": "AverageValue", "averageValue": "800m"},
                    },
                },
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }


def test_saturation_hpa_reads_the_recorded_replica_count_of_its_service(make_spec):
    isvc = make_spec(autoscaling={"enabled": True, "policy": "saturation", "maxReplicas": 8})

    hpa = build_hpa(isvc)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "sluice_saturation_desired_replicas",
                    "selector": {"matchLabels": {"inferenceservice": "chat"}},
                },
                "target": {"type": "AverageValue", "averageValue": "1"},
            },
        }
    ]
    assert hpa["spec"]["maxReplicas"] == 8
    assert hpa["spec"]["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 300}


def test_pdb_is_exactly_this(make_spec):
    assert build_pdb(make_spec(replicas=2)) == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": META,
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": SELECTOR},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def test_podmonitor_is_exactly_this(make_spec):
    assert build_podmonitor(make_spec()) == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": META,
        "spec": {
            "selector": {"matchLabels": SELECTOR},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def test_selector_string_matches_the_selector_labels():
    assert (
        selector_string("chat")
        == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=sluice-runtime"
    )


@pytest.mark.parametrize(
    ("value", "quantity"), [(8, "8"), (8.0, "8"), (0.8, "800m"), (2.5, "2500m"), (0.0001, "1m")]
)
def test_metric_targets_become_quantities(value, quantity):
    assert to_quantity(value) == quantity


BASE = ["Deployment", "Service", "PodDisruptionBudget"]


@pytest.mark.parametrize(
    ("spec", "podmonitors", "kinds", "removed"),
    [
        ({}, None, BASE, [HPAS, NETWORKPOLICIES]),  # a PDB even for one replica
        ({"replicas": 2}, None, BASE, [HPAS, NETWORKPOLICIES]),
        (
            {"autoscaling": {"enabled": True}},
            None,
            [*BASE, "HorizontalPodAutoscaler"],
            [NETWORKPOLICIES],
        ),
        (
            {
                "autoscaling": {"enabled": True, "minReplicas": 2},
                "networkPolicy": {"enabled": True},
            },
            True,
            [*BASE, "HorizontalPodAutoscaler", "PodMonitor", "NetworkPolicy"],
            [],
        ),
        ({}, False, BASE, [HPAS, PODMONITORS, NETWORKPOLICIES]),
    ],
    ids=["one-replica", "two-replicas", "autoscaled", "everything", "monitoring-off"],
)
def test_plan_names_the_children_to_apply_and_remove(make_spec, spec, podmonitors, kinds, removed):
    result = plan(make_spec(**spec), podmonitors=podmonitors)

    assert [obj["kind"] for obj in result.apply] == kinds
    assert [resource for resource, name in result.remove if name == "chat"] == removed


def pod_of(isvc, **kwargs) -> dict:
    return build_deployment(isvc, **kwargs)["spec"]["template"]["spec"]


def test_the_drain_budget_follows_the_grace_period(make_spec):
    args = pod_of(make_spec(terminationGracePeriodSeconds=300, startupTimeoutSeconds=600))[
        "containers"
    ][0]["args"]
    assert args[args.index("--drain-timeout") + 1] == "290"  # 300 − 5 s preStop − 5 s to exit
    assert args[args.index("--startup-timeout") + 1] == "600"


def test_liveness_asks_whether_the_scheduler_is_alive_readiness_whether_it_serves(make_spec):
    container = pod_of(make_spec())["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"


def test_tensor_parallel_pods_get_one_gpu_per_rank_and_a_sized_shm(make_spec):
    pod = pod_of(make_spec(resources={"gpus": 4, "shmSize": "8Gi"}))
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == "4"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]


def test_topology_spread_can_be_replaced_or_turned_off(make_spec):
    mine = [{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"a": "b"}}}]  # fmt: skip
    assert (
        pod_of(make_spec(scheduling={"topologySpreadConstraints": mine}))[
            "topologySpreadConstraints"
        ]
        == mine
    )
    assert "topologySpreadConstraints" not in pod_of(
        make_spec(scheduling={"topologySpreadConstraints": []})
    )


def test_pod_options_reach_the_pods_and_cannot_replace_the_operators_labels(make_spec):
    isvc = make_spec(
        serviceAccountName="inference",
        imagePullSecrets=[{"name": "regcred"}],
        podMetadata={
            "labels": {"team": "ml"},
            "annotations": {"prometheus.io/path": "/x", "a": "b"},
        },
    )
    deployment = build_deployment(isvc)
    pod = deployment["spec"]["template"]["spec"]
    meta = deployment["spec"]["template"]["metadata"]
    assert pod["serviceAccountName"] == "inference"
    assert pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert meta["labels"] == {"team": "ml", **LABELS}
    assert meta["annotations"]["a"] == "b"
    assert meta["annotations"]["prometheus.io/path"] == "/metrics"  # the operator's wins


def test_the_platform_may_assign_the_uid(make_spec):
    context = pod_of(make_spec(), run_as_user=None)["securityContext"]
    assert context == {
        "runAsNonRoot": True,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_download_fetches_only_the_named_files_and_a_single_gguf_is_the_model(make_spec):
    isvc = make_spec(model={"source": "hf://Qwen/Qwen2.5-7B-Instruct-GGUF",
                            "files": ["qwen2.5-7b-instruct-q4_k_m.gguf"]})  # fmt: skip
    pod = pod_of(isvc)
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["SLUICE_MODEL_FILES"] == '["qwen2.5-7b-instruct-q4_k_m.gguf"]'
    assert pod["containers"][0]["args"][1] == "/models/hf/qwen2.5-7b-instruct-q4_k_m.gguf"


def test_a_shared_cache_claim_is_the_downloads_hf_home(make_spec):
    isvc = make_spec(
        model={"source": "hf://org/m", "cache": {"claimName": "hub"}, "storageSize": "40Gi"}
    )
    pod = pod_of(isvc)
    init, runtime = pod["initContainers"][0], pod["containers"][0]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["HF_HOME"] == "/models-cache" and env["SLUICE_MODEL_CACHE"] == "1"
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hub"}} in pod["volumes"]
    assert {"name": "model", "emptyDir": {}} in pod["volumes"]  # only a link lives there
    assert {"name": "model-cache", "mountPath": "/models-cache"} in init["volumeMounts"]
    assert {"name": "model-cache", "mountPath": "/models-cache", "readOnly": True} in runtime[
        "volumeMounts"
    ]
    assert "ephemeral-storage" not in runtime.get("resources", {}).get("requests", {})


def run_download_script(tmp_path, env: dict) -> list[dict]:
    """Run DOWNLOAD_SCRIPT against a stand-in huggingface_hub that records its calls and
    makes the snapshot folder the real one would."""
    stub = tmp_path / "stub"
    (stub / "huggingface_hub").mkdir(parents=True)
    (stub / "huggingface_hub" / "__init__.py").write_text(
        "import json, os\n"
        "def snapshot_download(**kwargs):\n"
        "    with open(os.environ['CALLS'], 'a') as f: f.write(json.dumps(kwargs) + '\\n')\n"
        "    path = kwargs['local_dir'] or os.path.join(os.environ['HF_HOME'], 'hub', 'snap')\n"
        "    os.makedirs(path, exist_ok=True)\n"
        "    return path\n"
    )
    calls = tmp_path / "calls.jsonl"
    full_env = {**env, "PYTHONPATH": str(stub), "CALLS": str(calls), "PATH": "/usr/bin:/bin"}
    for _ in range(2):  # a restarted init container runs it again on the same volumes
        subprocess.run([sys.executable, "-c", DOWNLOAD_SCRIPT], env=full_env, check=True)
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_the_download_script_passes_the_patterns_and_links_a_shared_snapshot(tmp_path):
    target = tmp_path / "models" / "hf"
    target.parent.mkdir()
    env = {
        "SLUICE_MODEL_REPO": "org/m",
        "SLUICE_MODEL_DIR": str(target),
        "SLUICE_MODEL_FILES": '["*.safetensors", "*.json"]',
        "SLUICE_MODEL_CACHE": "1",
        "HF_HOME": str(tmp_path / "cache"),
    }
    calls = run_download_script(tmp_path, env)
    assert calls[0] == {
        "repo_id": "org/m",
        "revision": None,
        "local_dir": None,
        "allow_patterns": ["*.safetensors", "*.json"],
        "ignore_patterns": None,
    }
    assert target.is_symlink() and target.resolve() == (tmp_path / "cache" / "hub" / "snap")


def test_the_download_script_without_patterns_skips_original_checkpoints(tmp_path):
    env = {"SLUICE_MODEL_REPO": "org/m", "SLUICE_MODEL_DIR": str(tmp_path / "hf"),
           "HF_HOME": str(tmp_path / "home")}  # fmt: skip
    calls = run_download_script(tmp_path, env)
    assert calls[0]["local_dir"] == str(tmp_path / "hf")
    assert calls[0]["allow_patterns"] is None
    assert calls[0]["ignore_patterns"] == ["*.pth", "*.pt", "original/*"]


def test_network_policy_is_exactly_this(make_spec):
    isvc = make_spec(networkPolicy={"enabled": True, "allowedNamespaces": ["apps", "default"]})

    def namespace(name: str) -> dict:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}

    assert build_networkpolicy(isvc) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": META,
        "spec": {
            "podSelector": {"matchLabels": SELECTOR},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [namespace("default"), namespace("apps")],
                    "ports": [{"protocol": "TCP", "port": "http"}],
                },
                {"from": [namespace("monitoring")], "ports": [{"protocol": "TCP", "port": "http"}]},
            ],  # fmt: skip
        },
    }
