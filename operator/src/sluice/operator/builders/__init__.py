"""Pure functions from a parsed InferenceServiceSpec to the child objects, as plain dicts.

No I/O and no clock: the same spec gives the same objects, so each builder is tested with
exact expected objects and validated against the Kubernetes schemas without a server.
Owner references are added by the reconcile (`kopf.adopt`), not here.
"""

from .deployment import build_deployment
from .hpa import build_hpa
from .networkpolicy import build_networkpolicy
from .pdb import build_pdb
from .podmonitor import build_podmonitor
from .service import build_service

__all__ = [
    "build_deployment",
    "build_hpa",
    "build_networkpolicy",
    "build_pdb",
    "build_podmonitor",
    "build_service",
]
