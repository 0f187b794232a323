"""How the operator logs in to the API server (for Kopf and for its own client).

In a pod: the service account. Elsewhere: the kubeconfig named by $KUBECONFIG (read at
login time) or ~/.kube/config. Kubeconfigs whose user authenticates through an exec
plugin or auth provider (EKS, GKE, OIDC) carry no static credentials; for those, the
official `kubernetes` client is used when it is installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import kopf


def login(**kwargs: Any) -> kopf.ConnectionInfo:
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if (info is None or not has_credentials(info)) and importlib.util.find_spec("kubernetes"):
        info = kopf.login_via_client(**kwargs) or info
    if info is None:
        raise kopf.LoginError("No service account and no kubeconfig: cannot reach the cluster.")
    return info


def has_credentials(info: kopf.ConnectionInfo) -> bool:
    return bool(info.token or info.username or info.certificate_path or info.certificate_data)
