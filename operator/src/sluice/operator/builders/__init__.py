"""Pure functions from a parsed InferenceServiceSpec to the child objects, as plain dicts.

No I/O and no clock: the same spec gives the same objects, so each builder is tested with
exact expected objects and validated against the Kubernetes schemas without a server.
Owner references are added by the reconcile (`kopf.adopt`), not here.
"""

from .deployment import build_deployment
from .hpa import build_hpa
from .inferencepool import build_inferencepool
from .networkpolicy import build_networkpolicy, build_router_networkpolicy
from .pdb import build_pdb, build_router_pdb
from .podmonitor import build_podmonitor, build_router_podmonitor
from .router import build_router_deployment
from .router_rbac import (
    build_router_role,
    build_router_role_binding,
    build_router_service_account,
)
from .service import build_service
from .workers import build_pool_service, build_workers_service

__all__ = [
    "build_deployment",
    "build_hpa",
    "build_inferencepool",
    "build_networkpolicy",
    "build_pdb",
    "build_podmonitor",
    "build_pool_service",
    "build_router_deployment",
    "build_router_networkpolicy",
    "build_router_pdb",
    "build_router_podmonitor",
    "build_router_role",
    "build_router_role_binding",
    "build_router_service_account",
    "build_service",
    "build_workers_service",
]
