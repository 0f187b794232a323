"""Names the operator owns: the API group, labels, volume paths and defaults.

Runtime-facing names (flags, port, health path, metric names) live in
`sluice.runtime.constants`; this module holds only what is private to the operator and
the CRD. The CRD in `crds/inferenceservice.yaml` repeats the defaults written here; a test
keeps the two in step.
"""

from __future__ import annotations

# --- the custom resource --------------------------------------------------------------
GROUP = "sluice.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "sisvc"
CRD_NAME = f"{PLURAL}.{GROUP}"
# the CRD schema this operator was built for (crds/inferenceservice.yaml carries it in the
# annotation below; bump both with every schema change)
CRD_SCHEMA_VERSION = 5
ANNOTATION_SCHEMA_VERSION = "sluice.dev/schema-version"

# --- who we are ---------------------------------------------------------------------------
FIELD_MANAGER = "sluice-operator"
# holds Deployment.spec.replicas while autoscaling takes it over (server-side apply's
# documented hand-over; see replicas.py)
HANDOVER_FIELD_MANAGER = "sluice-operator-replicas-handover"
MANAGER_LABEL_VALUE = "sluice-operator"
ANNOTATION_PREFIX = GROUP
DEFAULT_MAX_SURGE = 1  # spec.rollout: surge one pod, never take a serving pod down first
DEFAULT_MAX_UNAVAILABLE = 0
# on the Deployment: the InferenceService's spec.replicas when the Deployment was last applied
ANNOTATION_SPEC_REPLICAS = f"{GROUP}/spec-replicas"
# on every child: the hash of the object as rendered, so an unchanged one is not applied
ANNOTATION_APPLIED_HASH = f"{GROUP}/applied-hash"
# on an InferenceService: a new value resolves its hf:// revision again (revisions.py)
ANNOTATION_REFRESH_REVISION = f"{GROUP}/refresh-revision"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
EVENT_SOURCE = "sluice-operator"

# --- labels every child carries ------------------------------------------------------------
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
APP_NAME = "sluice-runtime"
COMPONENT = "inference"
PART_OF = "sluice"

# --- the runtime container ------------------------------------------------------------------
LABEL_POD_TEMPLATE_HASH = "pod-template-hash"  # set by the Deployment controller
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"  # every namespace has it (1.21+)
TOPOLOGY_KEY_NODE = "kubernetes.io/hostname"
CONTAINER_NAME = "runtime"
DOWNLOAD_CONTAINER_NAME = "model-download"
LORA_DOWNLOAD_CONTAINER_NAME = "lora-download"
MAX_LORA_ADAPTERS = 32  # spec.model.lora.adapters
DEFAULT_IMAGE = "sluice-runtime:latest"
RUN_AS_USER = 1000  # the runtime image's non-root user (uid and gid); see settings
SERVICE_PORT = 80
SERVICE_PORT_NAME = "http"
BIND_HOST = "0.0.0.0"

# volumes and where they are mounted
MODELS_DIR = "/models"
HF_MODEL_DIR = f"{MODELS_DIR}/hf"
PVC_MODEL_DIR = f"{MODELS_DIR}/pvc"
CACHE_DIR = "/var/cache/sluice"
TMP_DIR = "/tmp"
SHM_DIR = "/dev/shm"
SHARED_CACHE_DIR = "/models-cache"  # a ReadWriteMany claim: the download's HF_HOME
VOLUME_MODEL = "model"
LORA_DIR = (
    "/lora"  # spec.model.lora: hf:// adapters in LORA_DIR/hf/NAME, pvc:// claims under LORA_DIR/pvc
)
VOLUME_LORA = "lora"
ENV_LORA_ADAPTERS = "SLUICE_LORA_ADAPTERS"
VOLUME_MODEL_CACHE = "model-cache"
VOLUME_CACHE = "cache"
VOLUME_TMP = "tmp"
VOLUME_SHM = "dshm"

ENV_HF_TOKEN = "HF_TOKEN"
ENV_HF_HOME = "HF_HOME"
ENV_XDG_CACHE_HOME = "XDG_CACHE_HOME"
ENV_MODEL_REPO = "SLUICE_MODEL_REPO"
ENV_MODEL_REVISION = "SLUICE_MODEL_REVISION"
ENV_MODEL_DIR = "SLUICE_MODEL_DIR"
ENV_MODEL_FILES = "SLUICE_MODEL_FILES"
ENV_MODEL_CACHE = "SLUICE_MODEL_CACHE"

# --- probes and draining ----------------------------------------------------------------------
STARTUP_PROBE_PERIOD_SECONDS = 10
READINESS_PERIOD_SECONDS = 5
LIVENESS_PERIOD_SECONDS = 10
LIVENESS_FAILURE_THRESHOLD = 6
PROBE_TIMEOUT_SECONDS = 5
PRESTOP_SLEEP_SECONDS = 5  # let Service endpoints drop the pod before SIGTERM starts the drain
DRAIN_EXIT_MARGIN_SECONDS = 5  # after the drain: stop the child processes and exit
MIN_DRAIN_SECONDS = 5
MIN_TERMINATION_GRACE_SECONDS = (
    PRESTOP_SLEEP_SECONDS + DRAIN_EXIT_MARGIN_SECONDS + MIN_DRAIN_SECONDS
)
PROGRESS_DEADLINE_MARGIN_SECONDS = 600  # image pull, scheduling, model download

# --- spec defaults (mirrored in the CRD's openAPIV3Schema) --------------------------------------
DEFAULT_REPLICAS = 1
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_TENSOR_PARALLEL_SIZE = 1
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 4
DEFAULT_METRICS = (("queueDepth", 2.0),)  # from the `sluice plan` run in docs/autoscaling.md
DEFAULT_AUTOSCALING_POLICY = "hpa"
DEFAULT_SCALE_UP_WINDOW_SECONDS = 0
DEFAULT_SCALE_DOWN_WINDOW_SECONDS = 300
DEFAULT_STARTUP_TIMEOUT_SECONDS = 1800
DEFAULT_TERMINATION_GRACE_SECONDS = 120
DEFAULT_HF_TOKEN_KEY = "HF_TOKEN"
DEFAULT_API_KEY_KEY = "SLUICE_API_KEY"
DEFAULT_MONITORING_NAMESPACE = "monitoring"
SHM_GIB_PER_RANK = 1  # default /dev/shm size per tensor-parallel rank

# --- bounds (mirrored in the CRD) --------------------------------------------------------------------
MAX_NAME_LENGTH = 52  # Deployment name + ReplicaSet hash + pod suffix stay within 63 characters
MAX_REPLICAS = 512
MAX_GPUS = 16
MAX_TENSOR_PARALLEL_SIZE = 16
MAX_EXTRA_ARGS = 32

# autoscaling metric types → the per-pod custom metric the HPA reads (names from the runtime)
METRIC_QUEUE_DEPTH = "queueDepth"
METRIC_KV_TOKEN_USAGE = "kvTokenUsage"
METRIC_TYPES = (METRIC_QUEUE_DEPTH, METRIC_KV_TOKEN_USAGE)
# autoscaling.policy: hpa (the HPA on the per-pod metrics above) or saturation (the HPA on
# the External metric the saturation recording rule computes, see builders/hpa.py)
POLICY_HPA = "hpa"
POLICY_SATURATION = "saturation"
AUTOSCALING_POLICIES = (POLICY_HPA, POLICY_SATURATION)

# --- status --------------------------------------------------------------------------------------
PHASE_PENDING = "Pending"
PHASE_PROGRESSING = "Progressing"
PHASE_READY = "Ready"
PHASE_DEGRADED = "Degraded"
PHASE_FAILED = "Failed"
PHASES = (PHASE_PENDING, PHASE_PROGRESSING, PHASE_READY, PHASE_DEGRADED, PHASE_FAILED)

CONDITION_READY = "Ready"
CONDITION_AVAILABLE = "Available"
CONDITION_PROGRESSING = "Progressing"
CONDITION_DEGRADED = "Degraded"
CONDITION_TYPES = (CONDITION_READY, CONDITION_AVAILABLE, CONDITION_PROGRESSING, CONDITION_DEGRADED)

CONDITION_ROUTER_READY = "RouterReady"  # only while spec.router.enabled
# the optional APIs (PodMonitor, InferencePool): False while one is denied (optional.py)
CONDITION_OPTIONAL_RESOURCES = "OptionalResourcesAvailable"

REASON_INVALID_SPEC = "InvalidSpec"
REASON_APPLY_FAILED = "ApplyFailed"
REASON_NAME_CONFLICT = "NameConflict"
REASON_WAITING_FOR_GC = "WaitingForGarbageCollection"
REASON_REVISION_UNRESOLVED = "RevisionUnresolved"  # an hf:// revision the Hub did not resolve
REASON_FORBIDDEN = "Forbidden"  # the API server denied a request (403): RBAC, a policy, a quota

# --- the router in front of the runtime pods (spec.router) -----------------------------------
ROUTER_APP_NAME = "sluice-router"  # app.kubernetes.io/name of the router pods
ROUTER_COMPONENT = "router"
# Deployment, PodDisruptionBudget, ServiceAccount, Role, RoleBinding: <name>-router
ROUTER_SUFFIX = "-router"
WORKERS_SUFFIX = "-workers"  # the Service whose EndpointSlices the router watches
ROUTER_CONTAINER_NAME = "router"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"  # set on EndpointSlices by their controller
# the router image (Dockerfile target `router`: no torch) when spec.router.image is not set
DEFAULT_ROUTER_IMAGE = "sluice-router:latest"
DEFAULT_ROUTER_REPLICAS = 1
DEFAULT_ROUTER_POLICY = "cache-aware"
MAX_ROUTER_REPLICAS = 64
# the router's Deployment name must stay within MAX_NAME_LENGTH too
MAX_ROUTED_NAME_LENGTH = MAX_NAME_LENGTH - len(ROUTER_SUFFIX)
ROUTER_LIVENESS_FAILURE_THRESHOLD = 3

# --- the Gateway API Inference Extension (spec.inferencePool) ---------------------------------
INFERENCE_GROUP = "inference.networking.k8s.io"
EPP_SUFFIX = "-epp"  # the endpoint picker Service the inferencepool Helm chart names <pool>-epp
DEFAULT_EPP_PORT = 9002  # the endpoint picker's ext-proc gRPC port
EPP_FAILURE_MODES = ("FailClose", "FailOpen")
DEFAULT_EPP_FAILURE_MODE = "FailClose"
METRICS_COMPAT_VLLM = "vllm"  # what the endpoint picker reads by default

# --- prefill/decode disaggregation (spec.disaggregation) ----------------------------------------
ROLE_PREFILL = "prefill"  # `sluice serve --disaggregation-mode prefill`
ROLE_DECODE = "decode"
ROLES = (ROLE_PREFILL, ROLE_DECODE)
# on a P/D pool's pods (and its Deployment, Service, PDB, HPA): which pool, in the runtime
# flag's own words; each pool's Deployment and Service select on it
LABEL_DISAGGREGATION_MODE = f"{GROUP}/disaggregation-mode"
# each pool's Deployment, Service, PodDisruptionBudget and HPA: <name>-prefill, <name>-decode
MAX_DISAGGREGATED_NAME_LENGTH = MAX_NAME_LENGTH - len("-" + ROLE_PREFILL)
DEFAULT_POOL_REPLICAS = 1
# autoscaling metric types of the pools: the prefill pool scales on the prompt tokens waiting
# to be computed, the decode pool on the requests it decodes
METRIC_QUEUE_PROMPT_TOKENS = "queuePromptTokens"
METRIC_RUNNING_REQUESTS = "runningRequests"
METRIC_DISAGG_WAITING_REQUESTS = "disaggWaitingRequests"
POOL_METRIC_TYPES = {
    ROLE_PREFILL: (METRIC_QUEUE_PROMPT_TOKENS, METRIC_QUEUE_DEPTH),
    ROLE_DECODE: (METRIC_RUNNING_REQUESTS, METRIC_KV_TOKEN_USAGE, METRIC_DISAGG_WAITING_REQUESTS),
}
# not measured with `sluice plan` yet: one chunked-prefill batch of an 80-160 GiB GPU waiting
# per prefill pod, and the CPU's default request slots running per decode pod
DEFAULT_POOL_METRICS = {
    ROLE_PREFILL: ((METRIC_QUEUE_PROMPT_TOKENS, 8192.0),),
    ROLE_DECODE: ((METRIC_RUNNING_REQUESTS, 64.0),),
}
