"""``modelplex build app.py:app``: the manifests a graph becomes, and clear errors for bad targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modelplex.handles import DeploymentHandle
from modelplex.serve.build import documents, is_app_target
from modelplex.serve.graph import ENV_APPLICATION, ENV_DEPLOYMENT
from modelplex.serve.hosted import ENV_APP, ENV_APP_DIR, FromApp
from modelplex.wire.spec import SpecError, parse_deployment
from modelplex_launcher.cli import main

ROOT = Path(__file__).resolve().parents[3]
COMPOSITION = f"{ROOT}/examples/serve/composition_app.py:app"

BATCHED_APP = '''
from modelplex import serve

@serve.deployment(ray_actor_options={"num_gpus": 1})
class Scorer:
    @serve.multiplexed(max_num_models_per_replica=7)
    async def load_model(self, model_id: str):
        return model_id

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.02)
    async def __call__(self, requests: list) -> list:
        return requests

app = Scorer.bind()
not_an_app = Scorer
'''


def test_app_targets_are_told_from_manifests():
    assert is_app_target("app.py:app") and is_app_target("pkg.module:app") and is_app_target("dir/app:graph")
    assert not is_app_target("deploy.yaml") and not is_app_target("C.yaml")


def test_each_deployment_of_the_graph_is_a_manifest_with_its_edges_and_options():
    upstream, downstream = documents(COMPOSITION, image="registry.local/app:1", namespace="team")
    assert upstream["metadata"] == {"name": "upstream", "namespace": "team",
                                    "annotations": {"modelplex.io/handles": "downstream"}}
    assert upstream["spec"]["replicas"] == 2 and upstream["spec"]["maxOngoingRequests"] == 16
    assert upstream["spec"]["resources"] == {"requests": {"cpu": "1"}}
    assert downstream["metadata"]["name"] == "downstream" and downstream["spec"]["replicas"] == 1
    for document in (upstream, downstream):
        assert document["spec"]["image"] == "registry.local/app:1"
        assert document["spec"]["handler"] == "modelplex.serve.hosted:FromApp"
        env = {variable["name"]: variable["value"] for variable in document["spec"]["env"]}
        assert env[ENV_APP] == "composition_app:app"
        # Ray's HTTP contract, and what serve.get_replica_context() reports in its replicas.
        assert document["spec"]["http"] == {"request": "starlette"}
        assert env[ENV_APPLICATION] == "default"
    assert [env_of(document)[ENV_DEPLOYMENT] for document in (upstream, downstream)] == ["Upstream", "Downstream"]


def env_of(document: dict) -> dict[str, str]:
    return {variable["name"]: variable["value"] for variable in document["spec"]["env"]}


def test_batching_and_multiplexing_come_from_the_decorators(tmp_path):
    (tmp_path / "scorer_app.py").write_text(BATCHED_APP)
    [scorer] = documents(f"{tmp_path}/scorer_app.py:app", image="img")
    spec = parse_deployment(scorer).spec
    assert spec.multiplexing.max_models_per_replica == 7
    assert (spec.batching.max_batch_size, spec.batching.batch_wait_timeout_ms) == (16, 20)
    assert spec.resources == {"limits": {"nvidia.com/gpu": 1}}


@pytest.mark.parametrize(("target", "message"), [
    ("missing_file.py:app", "no file"),
    ("{tmp}/scorer_app.py:nothing", "has no 'nothing'"),
    ("{tmp}/scorer_app.py:not_an_app", "not an application"),
])
def test_a_bad_target_is_a_clear_error(tmp_path, target, message):
    (tmp_path / "scorer_app.py").write_text(BATCHED_APP)
    with pytest.raises(SpecError, match=message):
        documents(target.format(tmp=tmp_path), image="img")


def test_the_replica_builds_its_node_of_the_graph_with_a_handle_for_each_edge(monkeypatch):
    [upstream, _] = documents(COMPOSITION, image="local", local=True)
    env = {var["name"]: var["value"] for var in upstream["spec"]["env"]}
    assert env[ENV_APP_DIR] == str(ROOT / "examples" / "serve")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MODELPLEX_ROUTER_DOWNSTREAM", "http://127.0.0.1:8123")
    instance = FromApp(parse_deployment(upstream))
    assert type(instance).__name__ == "Upstream"
    assert isinstance(instance._h, DeploymentHandle) and instance._h.url == "http://127.0.0.1:8123"


def test_the_build_command_writes_manifests_that_parse(tmp_path, capsys):
    output = tmp_path / "app.yaml"
    assert main(["build", COMPOSITION, "--image", "registry.local/app:1", "-o", str(output)]) == 0
    names = [parse_deployment(doc).name for doc in yaml.safe_load_all(output.read_text())]
    assert names == ["upstream", "downstream"]
    assert "2 deployment(s)" in capsys.readouterr().err
    assert main(["build", "nowhere.py:app", "--image", "img"]) == 2
    assert "no file" in capsys.readouterr().err


TWO_VIDEO_APPS = '''
from modelplex import serve

@serve.deployment
class DecodeVideo:
    def __init__(self, codec):
        self.codec = codec

@serve.deployment
class Orchestrator:
    def __init__(self, decode):
        self.decode = decode

naive = Orchestrator.bind(DecodeVideo.bind("h264"))
streaming = Orchestrator.bind(DecodeVideo.bind("vp9"))
'''


def test_two_applications_built_by_name_may_share_deployment_names(tmp_path, monkeypatch):
    """Issue 31, item 2: both video apps have a decode-video; built into one namespace, the
    second replaced the first's. Scoped by application name, as Ray scopes them, they do not."""
    (tmp_path / "videos.py").write_text(TWO_VIDEO_APPS)
    built = {name: documents(f"{tmp_path}/videos.py:{name}", image="img", name=f"video-{name}")
             for name in ("naive", "streaming")}
    names = [doc["metadata"]["name"] for docs in built.values() for doc in docs]
    assert names == ["video-naive-orchestrator", "video-naive-decode-video",
                     "video-streaming-orchestrator", "video-streaming-decode-video"]
    orchestrator, decode = built["streaming"]
    assert orchestrator["metadata"]["labels"] == {"modelplex.io/app": "video-streaming"}
    assert orchestrator["metadata"]["annotations"] == {"modelplex.io/handles": "video-streaming-decode-video"}
    # The replica finds its own node by the scoped name, and its handle the application's own edge.
    for variable in orchestrator["spec"]["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MODELPLEX_ROUTER_VIDEO_STREAMING_DECODE_VIDEO", "http://127.0.0.1:8124")
    instance = FromApp(parse_deployment(orchestrator))
    assert instance.decode.url == "http://127.0.0.1:8124"
    assert FromApp(parse_deployment(decode)).codec == "vp9"


def test_the_deployments_of_one_application_list_each_other_as_callers_and_no_one_else(tmp_path):
    (tmp_path / "videos.py").write_text(TWO_VIDEO_APPS)
    orchestrator, decode = documents(f"{tmp_path}/videos.py:streaming", image="img", name="video-streaming")
    assert orchestrator["spec"]["router"]["callers"] == ["video-streaming-decode-video"]
    assert decode["spec"]["router"]["callers"] == ["video-streaming-orchestrator"]
    assert parse_deployment(decode).spec.router.callers == ("video-streaming-orchestrator",)
    (alone,) = documents(f"{tmp_path}/videos.py:naive", image="img", name="solo")[1:]
    assert alone["spec"]["router"]["callers"] == ["solo-orchestrator"]  # its own application only


def test_rays_matching_timeout_variable_sets_the_spec_and_a_bad_value_is_refused_by_name(monkeypatch, capsys):
    monkeypatch.setenv("RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S", "2.5")
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "5")
    [upstream, _] = documents(COMPOSITION, image="img")
    assert upstream["spec"]["multiplexing"]["matchingTimeoutSeconds"] == 2.5
    assert parse_deployment(upstream).spec.multiplexing.matching_timeout_seconds == 2.5
    assert "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S has no effect" in capsys.readouterr().err
    monkeypatch.setenv("RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S", "soon")
    with pytest.raises(SpecError, match="RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S='soon'"):
        documents(COMPOSITION, image="img")


CONFIGURED_APP = '''
from modelplex import serve

@serve.deployment(user_config={"threshold": 0.5, "labels": ["cat", "dog"]})
class Classifier:
    def __init__(self):
        self.applied = []

    def reconfigure(self, config):
        self.applied.append(config)

app = Classifier.bind()
raw = Classifier.options(user_config={"when": object()}).bind()

@serve.deployment(user_config={"threshold": 0.5})
class NoReconfigure:
    pass

unconfigurable = NoReconfigure.bind()
'''


def test_the_manifest_carries_user_config_and_the_replica_applies_the_manifests_over_the_codes(tmp_path, monkeypatch):
    """In a cluster the manifest's spec.userConfig is what the operator sends to live replicas
    (a change of it alone rolls no pod), so the replica applies that one, once, at its start."""
    from modelplex_replica.handler import build_handler

    (tmp_path / "classifier.py").write_text(CONFIGURED_APP)
    [document] = documents(f"{tmp_path}/classifier.py:app", image="img", local=True)
    assert document["spec"]["userConfig"] == {"threshold": 0.5, "labels": ["cat", "dog"]}
    document["spec"]["userConfig"] = {"threshold": 0.9, "labels": ["cat"]}  # edited, as Ray's config file
    for variable in document["spec"]["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])
    instance = build_handler(parse_deployment(document))
    assert instance.applied == [{"threshold": 0.9, "labels": ["cat"]}]
    with pytest.raises(SpecError, match="user_config must be JSON"):
        documents(f"{tmp_path}/classifier.py:raw", image="img")
    with pytest.raises(SpecError, match="NoReconfigure: has a user_config but no reconfigure"):
        documents(f"{tmp_path}/classifier.py:unconfigurable", image="img")
