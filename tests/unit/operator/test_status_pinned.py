"""``status.models`` desired vs actual copies of declared models, and the ``ModelsPinned`` condition."""

from __future__ import annotations

from modelplex.wire.loaded import LoadedModels, LoadedSummary
from modelplex.wire.spec import parse_spec
from modelplex_operator.status import DeploymentView, Outcome, PodView, Resource, compute_status, condition, transitions

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
DEPLOYMENTS = [DeploymentView("recs-replica", "replica", 1, 1, 2, 2, 2, 2, 2),
               DeploymentView("recs-router", "router", 1, 1, 1, 1, 1, 1, 1)]


def resource(models, status=None, replicas=2):
    spec = {"replicas": replicas, "image": "recs:1", "handler": "recs:Recs", "models": models,
            "multiplexing": {"maxModelsPerReplica": 2}}
    return Resource("recs", "team-a", "uid-1", 1, parse_spec(spec), status or {})


def pods(*names):
    return [PodView(name, True, False, LoadedSummary(capacity=2)) for name in names]


def documents(**held):
    return {pod: LoadedModels(version=1, capacity=2, models=tuple(models)) for pod, models in held.items()}


def status_of(models, held, status=None, names=("a", "b")):
    return compute_status(resource(models, status), DEPLOYMENTS, pods(*names), Outcome("uid-1", 1, "ok"), T0,
                          documents(**held))


def test_a_declared_model_shows_desired_and_actual_copies_first_even_when_no_replica_holds_it():
    status = status_of([{"match": "hot", "minCopies": 2}, {"match": "cold", "minCopies": 1}],
                       {"a": ["x", "y"], "b": ["x", "hot"]})
    first, second, *rest = status["models"]
    assert first == {"name": "hot", "copies": 1, "bytes": 0, "replicas": ["b"], "desiredCopies": 2}
    assert second == {"name": "cold", "copies": 0, "bytes": 0, "replicas": [], "desiredCopies": 1}
    assert rest == [{"name": "x", "copies": 2, "bytes": 0, "replicas": ["a", "b"]},
                    {"name": "y", "copies": 1, "bytes": 0, "replicas": ["a"]}]
    pinned = condition(status, "ModelsPinned")
    assert pinned["status"] == "False" and pinned["reason"] == "CopiesMissing"
    assert pinned["message"].startswith("cold: 0/1 copies; hot: 1/2 copies")


def test_models_pinned_is_true_when_every_declared_copy_is_loaded():
    status = status_of([{"match": "hot", "minCopies": 2}], {"a": ["hot"], "b": ["hot", "x"]})
    pinned = condition(status, "ModelsPinned")
    assert pinned["status"] == "True" and pinned["reason"] == "CopiesLoaded"
    assert status["models"][0]["desiredCopies"] == 2 and status["models"][0]["copies"] == 2


def test_a_spec_that_cannot_fit_names_the_models_and_what_is_missing():
    status = status_of([{"match": "hot", "minCopies": 3}], {"a": ["hot"], "b": ["hot"]})
    pinned = condition(status, "ModelsPinned")
    assert pinned["status"] == "False" and pinned["reason"] == "CannotFit"
    assert "hot: 2/3 copies" in pinned["message"] and "2 ready replica(s)" in pinned["message"]


def test_more_pinned_copies_than_model_slots_cannot_fit():
    models = [{"match": f"m{i}", "minCopies": 2} for i in range(3)]  # 6 copies, 2 replicas x 2 slots
    status = status_of(models, {"a": ["m0", "m1"], "b": ["m0", "m1"]})
    pinned = condition(status, "ModelsPinned")
    assert pinned["reason"] == "CannotFit" and "m2: 0/2 copies" in pinned["message"]


def test_without_declared_copies_there_is_no_models_pinned_condition():
    status = status_of([{"match": "hot*", "weight": 2}], {"a": ["hot-1"]})
    assert condition(status, "ModelsPinned") is None
    assert "desiredCopies" not in status["models"][0]


def test_an_event_when_a_spec_cannot_fit_and_when_the_copies_are_back_but_not_while_they_first_load():
    loading = status_of([{"match": "hot", "minCopies": 2}], {"a": [], "b": []})
    assert not [e for e in transitions({}, loading) if "Pinned" in e[1]]
    loaded = status_of([{"match": "hot", "minCopies": 2}], {"a": ["hot"], "b": ["hot"]}, status=loading)
    assert ("Normal", "ModelsPinned", "1 declared model(s) have their copies loaded") in transitions(loading, loaded)
    lost = status_of([{"match": "hot", "minCopies": 2}], {"a": ["hot"], "b": []}, status=loaded)
    assert [e[:2] for e in transitions(loaded, lost)] == [("Warning", "PinnedCopiesMissing")]
    too_many = status_of([{"match": "hot", "minCopies": 3}], {"a": ["hot"], "b": ["hot"]}, status=loading)
    (event,) = [e for e in transitions(loading, too_many) if "Pinned" in e[1]]
    assert event[:2] == ("Warning", "PinnedCannotFit") and "hot: 2/3" in event[2]
