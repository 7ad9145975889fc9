"""The model cache in the Kubernetes API: per-model status and load-failure Events, end to end.

The chart's operator reads each ready replica's ``GET /v1/models`` (pod IP, from its own pod)
when the replica's annotation announces a newer version, lists every model with its copies,
holders and size in ``status.models``, and turns load failures into a Warning Event naming the
model, at most one per model every five minutes.
"""

from __future__ import annotations

import pytest

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import events_of, get_mxd, kubectl_apply, manifest, pods, predict, router_url, wait_settled

pytestmark = pytest.mark.e2e

SIZED = "mxd_handler:Sized"  # a model's size is 1000 bytes per character of its id


def model_entries(api, ns, name) -> dict[str, dict]:
    return {entry["name"]: entry for entry in get_mxd(api, ns, name).get("status", {}).get("models") or ()}


def test_status_lists_each_model_with_its_copies_holders_and_bytes(control_plane, modelplex_operator,
                                                                   kube_namespace, api):
    ns, name = kube_namespace, "sized"
    multiplexing = {"maxModelBytes": "1Mi", "hostCacheBytes": "4Mi", "maxConcurrentLoads": 2}
    kubectl_apply(control_plane, ns, manifest(name, replicas=2, handler=SIZED, multiplexing=multiplexing))
    obj = wait_settled(api, ns, name, replicas=2)
    assert obj["status"]["models"] == [] and obj["status"]["modelsOmitted"] == 0
    assert obj["status"]["poolCapacityBytes"] == 2 << 20

    # The warm tier's disk copies have their emptyDir, sized from hostCacheBytes, in the real pods.
    replica_pod = pods(api, ns, name)[0]
    (warm,) = [v for v in replica_pod.spec.volumes if v.name == "warm-models"]
    assert warm.empty_dir.size_limit == str(2 * (4 << 20))

    url = router_url(control_plane, ns, name)
    holders = {}
    for model in ("m1", "model-22", "model-333"):
        code, answer = predict(url, model, {"x": 1})
        assert code == 200, answer
        holders[model] = answer["pod"]

    def listed():
        entries = model_entries(api, ns, name)
        return entries if set(holders) <= set(entries) else None

    entries = wait_for(listed, timeout=60, interval=0.5, what="status.models to list m1, model-22, model-333")
    for model, holder in holders.items():
        assert entries[model] == {"name": model, "copies": 1, "bytes": 1000 * len(model), "replicas": [holder]}
    # The pool's bytes add up the replicas' annotations, the list their documents: a document read
    # may be newer than the annotation beside it, and the next refresh brings the annotation level.
    pool_bytes = sum(1000 * len(m) for m in holders)

    def counted():
        status = get_mxd(api, ns, name)["status"]
        return status if status.get("poolBytes") == pool_bytes else None

    status = wait_for(counted, timeout=60, interval=0.5, what=f"status.poolBytes to add up to {pool_bytes}")
    assert status["modelsOmitted"] == 0
    reported = next(c for c in status["conditions"] if c["type"] == "ModelsReported")
    assert reported["status"] == "True", reported


def test_a_model_that_fails_to_load_raises_one_warning_event_naming_it(control_plane, modelplex_operator,
                                                                       kube_namespace, api):
    ns, name = kube_namespace, "broken"
    kubectl_apply(control_plane, ns, manifest(name, replicas=1, handler=SIZED))
    wait_settled(api, ns, name, replicas=1)
    url = router_url(control_plane, ns, name)

    code, answer = predict(url, "broken-7", {})
    assert code >= 500 and "broken-7" in str(answer), (code, answer)

    def failure_events():
        return [e for e in events_of(api, ns, name) if e[1] == "ModelLoadFailed"]

    (event,) = wait_for(failure_events, timeout=60, interval=0.5, what="a ModelLoadFailed Event")
    kind, _, message = event
    assert kind == "Warning" and "'broken-7'" in message and "no weights for broken-7" in message, event

    # It keeps failing. A good model loaded after the failures shows in the status once the
    # operator has read a document that counts them all: still one Event.
    for _ in range(4):
        assert predict(url, "broken-7", {})[0] >= 500
    assert predict(url, "fine", {})[0] == 200
    wait_for(lambda: "fine" in model_entries(api, ns, name), timeout=60, interval=0.5,
             what="status.models to list the model loaded after the failures")
    assert len(failure_events()) == 1, failure_events()
