"""`python -m sluice.operator` runs the operator as a process and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from operator_cluster import Cluster, wait_for
from operator_testkit import IMAGE, isvc_object


def test_python_dash_m_runs_the_operator(tmp_path):
    cluster = Cluster()
    log = (tmp_path / "operator.log").open("w+")
    env = os.environ | {
        "KUBECONFIG": str(cluster.write_kubeconfig(tmp_path / "config")),
        "SLUICE_DEFAULT_IMAGE": IMAGE,
        "SLUICE_LOG_FORMAT": "json",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice.operator"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        cluster.create(isvc_object("chat", "entrypoint"))
        deployment = wait_for(
            lambda: cluster.get("apps/v1", "deployments", "entrypoint", "chat"),
            timeout=30,
            what="the operator process to create the Deployment",
        )
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
        wait_for(  # logged before the Event is posted
            lambda: any(
                e["reason"] == "Created" for e in cluster.list("v1", "events", "entrypoint")
            ),
            timeout=30,
            what="the Created event",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        cluster.close()
    log.seek(0)
    output = log.read()
    assert code == 0, output
    assert '"message": "Created Deployment entrypoint/chat."' in output  # JSON log lines
