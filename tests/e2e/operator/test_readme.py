"""The README's Kubernetes section as written: the zoo's TorchScript models, served over HTTP
from the node's address, loaded by the built-in handler of the project's replica image, and
a prediction through the router Service's ClusterIP."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modelplex.processes import spawn, stop
from modelplex_cluster import node
from modelplex_cluster.testing import http_get, wait_for

from e2e.operator.helpers import READY_TIMEOUT, REPO, pods, predict, router_url, wait_settled

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "operator" / "zoo-local.yaml"


def test_the_readme_zoo_example(control_plane, modelplex_operator, kube_namespace, api, tmp_path):
    models = tmp_path / "models"
    subprocess.run([sys.executable, str(REPO / "examples" / "zoo" / "build_zoo.py"), "--count", "8",
                    "--out", str(models)], check=True, timeout=300)
    server = spawn([sys.executable, "-m", "http.server", "8080", "--bind", node.NODE_IP, "--directory", str(models)],
                   log=tmp_path / "models.log")
    try:
        wait_for(lambda: http_get(f"http://{node.NODE_IP}:8080/model-07.pt")[0] == 200, timeout=30,
                 what="the model server on the node's address")
        control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(EXAMPLE))
        wait_settled(api, kube_namespace, "zoo", replicas=1, timeout=READY_TIMEOUT * 2)
        (replica,) = pods(api, kube_namespace, "zoo")
        assert replica.spec.containers[0].image == "modelplex/replica:0.1.0"

        url = router_url(control_plane, kube_namespace, "zoo")
        code, answer = predict(url, "model-07", {"inputs": [list(range(16))]}, timeout=120)
        assert code == 200, answer
        (row,) = answer["outputs"]
        assert len(row) == 4 and all(isinstance(x, float) for x in row)
        # the same model answers the same again; another model answers differently
        assert predict(url, "model-07", {"inputs": [list(range(16))]})[1] == answer
        assert predict(url, "model-03", {"inputs": [list(range(16))]})[1] != answer
    finally:
        stop(server)
