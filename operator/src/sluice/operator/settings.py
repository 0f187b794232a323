"""Operator configuration: one frozen dataclass, built once from the environment and flags.

Every knob has an environment variable (what a Helm chart sets) and, for
`python -m sluice.operator`, a command-line flag with the same meaning. Nothing below the
handlers reads the environment: they get this object from Kopf's `memo`.

| variable                        | default                  | meaning                                      |
|---------------------------------|--------------------------|----------------------------------------------|
| SLUICE_DEFAULT_IMAGE            | sluice-runtime:latest    | runtime image when `spec.image` is not set   |
| SLUICE_ROUTER_IMAGE             | sluice-router:latest     | router image without `spec.router.image`     |
| SLUICE_NAMESPACES               | (empty: cluster-wide)    | comma-separated namespaces to watch          |
| SLUICE_LOG_FORMAT               | plain                    | plain, full or json                          |
| SLUICE_VERBOSE                  | false                    | debug logging                                |
| SLUICE_CLUSTER_DOMAIN           | cluster.local            | used in `status.url`                         |
| SLUICE_POD_MONITORS             | auto                     | auto: PodMonitors where served; never; off   |
| SLUICE_INFERENCE_POOLS          | auto                     | auto: InferencePools where served; off       |
| SLUICE_LEADER_ELECTION          | false                    | HA: only the Lease holder reconciles         |
| SLUICE_LEASE_NAME               | sluice-operator          | the Lease's name                             |
| SLUICE_LEASE_NAMESPACE          | (required with election) | the Lease's namespace (the operator's own)   |
| SLUICE_IDENTITY                 | (empty: host name + uid) | this replica in the Lease (the pod's name)   |
| SLUICE_LEASE_DURATION_SECONDS   | 15                       | a standby takes a Lease unrenewed this long  |
| SLUICE_RENEW_DEADLINE_SECONDS   | 10                       | a leader unrenewed this long stops writing   |
| SLUICE_RETRY_PERIOD_SECONDS     | 2                        | how often the Lease is tried or renewed      |
| SLUICE_LIVENESS_ENDPOINT        | (empty: off)             | e.g. http://0.0.0.0:8080/healthz             |
| SLUICE_RETRY_DELAY_SECONDS      | 10                       | first back-off after a failed reconcile      |
| SLUICE_RETRY_MAX_DELAY_SECONDS  | 300                      | back-off cap (it doubles per failure)        |
| SLUICE_RESYNC_SECONDS           | 300                      | every object is reconciled at least this often|
| SLUICE_WORKERS                  | 4                        | objects reconciled at once                   |
| SLUICE_API_TIMEOUT_SECONDS      | 30                       | timeout of one API request                   |
| SLUICE_RUN_AS_USER              | 1000                     | pods' uid/gid/fsGroup; `none`: the platform's|
| SLUICE_ROLL_ON_UPGRADE          | false                    | a new default image rolls existing services  |
| SLUICE_SCHEDULING_GRACE_SECONDS | 600                      | an unschedulable pod waits for a new node    |
| SLUICE_HF_ENDPOINT              | https://huggingface.co   | Hub API that pins hf:// revisions (a mirror) |

Services without `spec.image` keep the image they were last applied with until their spec
changes (`status.image`), so upgrading the operator (a new default image) does not roll
the whole fleet at once; SLUICE_ROLL_ON_UPGRADE=true moves them to the new default on the
next reconcile instead. The router image is not held back that way: router pods hold no
model and roll a new one before an old one goes, so they follow SLUICE_ROUTER_IMAGE at
once. The router image carries `sluice router` without torch (Dockerfile target
`router`).

A pod no node fits is Progressing (reason WaitingForCapacity: a cluster autoscaler or
Karpenter may be adding a node) for SLUICE_SCHEDULING_GRACE_SECONDS after the scheduler
first marked it Unschedulable, then Degraded with a Warning Event; 0 makes it Degraded at
once.

PodMonitors and InferencePools are optional APIs: `auto` uses one where the API server
serves it; `never` (PodMonitors) deletes ours and creates none; `off` means the operator
has no access (the chart sets it when `rbac.podMonitors` / `rbac.inferencePools` is false):
it neither watches, reads, creates nor deletes that kind (see optional.py).

High availability is leader election on a Lease (leader.py): every replica watches, only
the holder reconciles, and every write is fenced by the freshness of its Lease.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import constants


@dataclass(frozen=True)
class LeaseTiming:
    """client-go's leader election periods (leader.py)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration:"
                f" {self.retry_period:g}, {self.renew_deadline:g}, {self.lease_duration:g}"
            )


LOG_FORMATS = ("plain", "full", "json")
POD_MONITOR_MODES = ("auto", "never", "off")
INFERENCE_POOL_MODES = ("auto", "off")


@dataclass(frozen=True)
class Settings:
    default_image: str = constants.DEFAULT_IMAGE
    router_image: str = constants.DEFAULT_ROUTER_IMAGE
    namespaces: tuple[str, ...] = ()
    log_format: str = "plain"
    verbose: bool = False
    cluster_domain: str = "cluster.local"
    pod_monitors: str = "auto"
    inference_pools: str = "auto"
    leader_election: bool = False
    lease_name: str = "sluice-operator"
    lease_namespace: str = ""
    identity: str = ""
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    liveness_endpoint: str | None = None
    retry_delay_seconds: float = 10.0
    retry_max_delay_seconds: float = 300.0
    resync_seconds: float = 300.0
    workers: int = 4
    api_timeout_seconds: float = 30.0
    run_as_user: int | None = constants.RUN_AS_USER
    roll_on_upgrade: bool = False
    scheduling_grace_seconds: float = 600.0
    hf_endpoint: str = constants.DEFAULT_HF_ENDPOINT

    def __post_init__(self) -> None:
        for what, image in (("default image", self.default_image),
                            ("router image", self.router_image)):  # fmt: skip
            if not image or any(c.isspace() for c in image):
                raise ValueError(f"{what} must be a non-empty image reference: {image!r}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {LOG_FORMATS}: {self.log_format!r}")
        if self.pod_monitors not in POD_MONITOR_MODES:
            raise ValueError(
                f"pod monitors must be one of {POD_MONITOR_MODES}: {self.pod_monitors!r}"
            )
        if self.inference_pools not in INFERENCE_POOL_MODES:
            raise ValueError(
                f"inference pools must be one of {INFERENCE_POOL_MODES}: {self.inference_pools!r}"
            )
        if min(self.retry_delay_seconds, self.api_timeout_seconds, self.resync_seconds) <= 0:
            raise ValueError("retry delay, resync period and API timeout must be positive")
        if self.scheduling_grace_seconds < 0:
            raise ValueError(
                f"scheduling grace must not be negative: {self.scheduling_grace_seconds}"
            )
        if self.retry_max_delay_seconds < self.retry_delay_seconds:
            raise ValueError("the maximum retry delay must not be below the retry delay")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1: {self.workers}")
        if self.leader_election:
            if not self.lease_namespace:
                raise ValueError(
                    "leader election needs the Lease's namespace: set SLUICE_LEASE_NAMESPACE"
                    " (the chart sets it to the operator's namespace)"
                )
            _ = self.lease_timing  # validates the three durations
        if self.run_as_user is not None and self.run_as_user < 1:
            raise ValueError(f"run as user must be a non-root uid or none: {self.run_as_user}")

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @property
    def lease_timing(self) -> LeaseTiming:
        return LeaseTiming(
            self.lease_duration_seconds, self.renew_deadline_seconds, self.retry_period_seconds
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read the SLUICE_* variables; unset or empty ones keep their defaults."""
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(_env_name(field.name), "").strip()
            if raw:
                values[field.name] = _convert(field.name, raw)
        return cls(**values)  # type: ignore[arg-type]

    def with_flags(self, argv: Sequence[str]) -> Settings:
        """Apply `python -m sluice.operator` flags over these settings."""
        parsed = build_arg_parser().parse_args(list(argv))
        changes = {key: value for key, value in vars(parsed).items() if value is not None}
        if "namespaces" in changes:
            changes["namespaces"] = tuple(changes["namespaces"])
        if "run_as_user" in changes:
            changes["run_as_user"] = _convert("run_as_user", changes["run_as_user"])
        return dataclasses.replace(self, **changes)


def _env_name(field: str) -> str:
    return "SLUICE_" + field.upper()


def _convert(field: str, raw: str) -> object:
    if field == "namespaces":
        return tuple(ns.strip() for ns in raw.split(",") if ns.strip())
    if field in ("verbose", "roll_on_upgrade", "leader_election"):
        return raw.lower() in ("1", "true", "yes", "on")
    if field == "workers":
        return int(raw)
    if field == "run_as_user":
        return None if raw.lower() in ("none", "null", "platform") else int(raw)
    if field.endswith("_seconds"):
        return float(raw)
    return raw


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.operator",
        description="Run the Sluice operator (InferenceService → Deployment, Service, HPA, PDB).",
        epilog="Every flag has a SLUICE_* environment variable; flags win.",
    )
    parser.add_argument("--default-image", help="runtime image when spec.image is not set")
    parser.add_argument(
        "--router-image", help="router image (no torch) when spec.router.image is not set"
    )
    parser.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        help="watch only this namespace (repeatable); default: cluster-wide",
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, help="log line format")
    parser.add_argument("--verbose", action="store_true", default=None, help="debug logging")
    parser.add_argument("--cluster-domain", help="cluster DNS domain used in status.url")
    parser.add_argument(
        "--pod-monitors", choices=POD_MONITOR_MODES,
        help="PodMonitors: auto (where served), never (delete ours), off (no access: untouched)",
    )  # fmt: skip
    parser.add_argument(
        "--inference-pools", choices=INFERENCE_POOL_MODES,
        help="InferencePools: auto (where served), off (no access: untouched)",
    )  # fmt: skip
    parser.add_argument(
        "--leader-election", action="store_true", default=None,
        help="HA: several replicas, only the holder of the Lease reconciles",
    )  # fmt: skip
    parser.add_argument("--lease-name", help="the leader election Lease's name")
    parser.add_argument("--lease-namespace", help="the Lease's namespace (the operator's own)")
    parser.add_argument("--identity", help="this replica's name in the Lease")
    parser.add_argument("--liveness-endpoint", help="e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--retry-delay-seconds", type=float, help="first back-off after a failure")
    parser.add_argument("--retry-max-delay-seconds", type=float, help="back-off cap")
    parser.add_argument("--resync-seconds", type=float, help="reconcile every object this often")
    parser.add_argument("--workers", type=int, help="objects reconciled at once")
    parser.add_argument("--api-timeout-seconds", type=float, help="timeout of one API request")
    parser.add_argument(
        "--scheduling-grace-seconds", type=float,
        help="an unschedulable pod is Progressing (waiting for a new node) this long, then Degraded",
    )  # fmt: skip
    parser.add_argument("--hf-endpoint", help="Hub API that resolves hf:// revisions (a mirror)")
    parser.add_argument("--run-as-user", help="uid of the runtime pods, or 'none' (platform's)")
    parser.add_argument(
        "--roll-on-upgrade", action="store_true", default=None,
        help="move services without spec.image to a new default image at once",
    )  # fmt: skip
    return parser
