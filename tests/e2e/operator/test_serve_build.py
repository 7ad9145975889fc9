"""A Ray Serve application on the cluster: ``modelplex build app.py:app`` → ``kubectl apply`` →
answers through the router Service.

The application is the seeds' composition, Upstream calling a multiplexed Downstream through
the handle it was built with, for model "bar". Its module goes into an image built on the
project's replica image (in ``/app``, on the image's PYTHONPATH, as a user's Dockerfile puts
it); the manifests are ``modelplex build``'s output, applied as they are.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import loaded_models, pods, predict, router_url, wait_settled

pytestmark = pytest.mark.e2e

IMAGE = "modelplex.local/serve-app-e2e:1"

APP = '''
import torch

from modelplex import serve
from modelplex.serve.handle import DeploymentHandle


@serve.deployment
class Downstream:
    @serve.multiplexed(max_num_models_per_replica=2)
    async def load_model(self, model_id: str):
        generator = torch.Generator().manual_seed(sum(map(ord, model_id)))
        return model_id, torch.randn(3, generator=generator)

    async def __call__(self, features):
        model_id, weights = await self.load_model(serve.get_multiplexed_model_id())
        return {"model": model_id, "score": float(weights @ torch.tensor(features, dtype=torch.float32))}


@serve.deployment
class Upstream:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    async def __call__(self, request):  # a starlette Request, as in Ray
        features = (await request.json())["features"]
        return await self._h.options(multiplexed_model_id="bar").remote(features)


app = Upstream.bind(Downstream.bind())
'''


def expected_score(model_id: str, features: list[float]) -> float:
    import torch

    generator = torch.Generator().manual_seed(sum(map(ord, model_id)))
    return float(torch.randn(3, generator=generator) @ torch.tensor(features, dtype=torch.float32))


@pytest.fixture(scope="module")
def app_folder():
    with tempfile.TemporaryDirectory(prefix="serve-app-") as folder:
        (Path(folder) / "serve_app.py").write_text(APP)
        yield Path(folder)


@pytest.fixture(scope="module")
def app_image(control_plane, project_images, app_folder):
    """The project's replica image with the application's module in /app (what ``FROM`` the replica
    image and ``COPY serve_app.py /app/`` make), put on the node as one more layer."""
    from modelplex_cluster import node

    node.derive_image(control_plane.containerd_socket, project_images["replica"], IMAGE,
                      {"app/serve_app.py": ((app_folder / "serve_app.py").read_bytes(), 0o644)})
    return IMAGE


def test_a_built_composed_app_answers_through_the_router_service_for_the_model_upstream_names(
        control_plane, modelplex_operator, app_image, app_folder, kube_namespace, api):
    manifests = app_folder / "app.yaml"
    built = subprocess.run([sys.executable, "-m", "modelplex_launcher.cli", "build", "serve_app.py:app", "--image", app_image,
                            "-o", str(manifests)], cwd=app_folder, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    documents = list(yaml.safe_load_all(manifests.read_text()))
    assert [doc["metadata"]["name"] for doc in documents] == ["upstream", "downstream"]
    assert documents[0]["metadata"]["annotations"] == {"modelplex.io/handles": "downstream"}

    control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(manifests))
    for name in ("upstream", "downstream"):
        wait_settled(api, kube_namespace, name, replicas=1)

    url = router_url(control_plane, kube_namespace, "upstream")
    for features in ([1.0, 2.0, 3.0], [0.5, -1.0, 4.0]):
        status, answer = predict(url, "", {"features": features}, timeout=60)
        assert status == 200, answer
        assert answer["model"] == "bar"
        assert abs(answer["score"] - expected_score("bar", features)) < 1e-4, answer

    # The downstream replica loaded model "bar" for those calls, and says so on its pod.
    def holds_one_model():
        replica = pods(api, kube_namespace, "downstream")
        return len(replica) == 1 and loaded_models(replica[0]) == 1

    wait_for(holds_one_model, timeout=60, what="the downstream pod's loaded-models annotation with one model")
