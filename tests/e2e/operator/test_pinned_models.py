"""Declared copies (``spec.models`` ``minCopies``) on the real node: the routers place them,
``status.models`` shows desired against actual copies with the ``ModelsPinned`` condition, and a
scale-down keeps a pinned model answering throughout (the operator pins it on the pod that stays
before the other goes)."""

from __future__ import annotations

import threading

import pytest

from modelplex_cluster.testing import wait_for

from e2e.operator.helpers import (condition, events_of, get_mxd, kubectl_apply, manifest, pods, predict, router_url,
                                  wait_settled)

pytestmark = pytest.mark.e2e

SOLOS = [f"solo-{i}" for i in range(10)]
#: "keep" on both replicas; ten models with one copy each, spread by the placement's hash; room
#: for all on one replica.
DECLARED = [{"match": "keep", "minCopies": 2}, *({"match": solo, "minCopies": 1} for solo in SOLOS)]


def declared_entries(api, ns, name) -> dict[str, dict]:
    models = get_mxd(api, ns, name).get("status", {}).get("models") or ()
    return {entry["name"]: entry for entry in models if "desiredCopies" in entry}


def test_status_shows_desired_and_actual_copies_and_a_scale_down_keeps_the_pinned_model_answering(
        control_plane, modelplex_operator, kube_namespace, api):
    ns, name = kube_namespace, "pinned"
    kubectl_apply(control_plane, ns, manifest(name, replicas=2, models=DECLARED,
                                              multiplexing={"maxModelsPerReplica": 12}))
    wait_settled(api, ns, name, replicas=2)

    # Placed by the routers alone: nobody asked for either model yet.
    def all_pinned():
        obj = get_mxd(api, ns, name)
        return obj if condition(obj, "ModelsPinned").get("status") == "True" else None

    wait_for(all_pinned, timeout=120, interval=1, what="ModelsPinned True")
    entries = declared_entries(api, ns, name)
    # At least the declared copies: a copy placed while one replica was ready stays loaded as an
    # ordinary cached model once the second one took over its lease (nothing evicts it).
    assert (entries["keep"]["copies"], entries["keep"]["desiredCopies"]) == (2, 2), entries
    assert all(entries[solo]["copies"] >= entries[solo]["desiredCopies"] == 1 for solo in SOLOS), entries
    # A spec.replicas scale-down removes the last pod by name; the operator first pins every
    # declared model on the other pod, where the routers' placement over it puts them.
    names = sorted(pod.metadata.name for pod in pods(api, ns, name))
    only_on_leaving = [solo for solo in SOLOS if entries[solo]["replicas"] == [names[-1]]]

    # Requests for the pinned models all through the scale-down: none may fail.
    url = router_url(control_plane, ns, name)
    answers: list[tuple[str, int]] = []
    stop = threading.Event()

    def send() -> None:
        while not stop.is_set() and len(answers) < 20_000:  # bounded
            for model in ("keep", *SOLOS):
                answers.append((model, predict(url, model, {"x": 1}, timeout=60)[0]))

    worker = threading.Thread(target=send, daemon=True)
    worker.start()
    try:
        control_plane.kubectl("scale", "mxd", name, "-n", ns, "--replicas", "1")
        wait_settled(api, ns, name, replicas=1)
        wait_for(lambda: len(pods(api, ns, name, live_only=False)) == 1, timeout=180, interval=1,
                 what="the removed replica pod gone")
        seen = len(answers)
        wait_for(lambda: len(answers) >= seen + 20, timeout=60, interval=0.2, what="more answers after the scale-down")
    finally:
        stop.set()
        worker.join(timeout=90)
    failed = [(model, code) for model, code in answers if code != 200]
    assert not failed and answers, f"{len(failed)} of {len(answers)} requests failed: {failed[:10]}"
    # The operator pinned them on the staying pod before the other went.
    operator_pod = modelplex_operator.pod(api)
    log = control_plane.kubectl("logs", "-n", modelplex_operator.namespace, operator_pod.metadata.name).stdout
    (line,) = [line for line in log.splitlines() if f"scale-down of {ns}/{name} to 1: before removing" in line]
    assert names[-1] in line and f"{names[0]}: keep, {', '.join(sorted(SOLOS))}" in line, line
    assert "failed" not in line and "HTTP" not in line, line

    # Desired against actual: 'keep' wants 2 copies on 1 replica now, which cannot fit.
    (staying,) = pods(api, ns, name)
    assert staying.metadata.name == names[0]  # the pod the operator chose to keep

    def cannot_fit():
        obj = get_mxd(api, ns, name)
        return obj if condition(obj, "ModelsPinned").get("reason") == "CannotFit" else None

    obj = wait_for(cannot_fit, timeout=120, interval=1, what="ModelsPinned False, CannotFit")
    pinned = condition(obj, "ModelsPinned")
    assert pinned["status"] == "False" and "keep: 1/2 copies" in pinned["message"], pinned
    entries = declared_entries(api, ns, name)
    assert all(entries[model]["replicas"] == [staying.metadata.name] for model in ("keep", *SOLOS)), entries
    assert all((entries[solo]["copies"], entries[solo]["desiredCopies"]) == (1, 1) for solo in SOLOS)
    assert any(reason == "PinnedCannotFit" for _, reason, _ in events_of(api, ns, name))
    print(f"only on the leaving pod before: {', '.join(only_on_leaving) or 'none'}; {len(answers)} requests, all 200")
