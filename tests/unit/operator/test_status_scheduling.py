"""Replica pods no node can take (e.g. ``nvidia.com/gpu: 1`` on a cluster without GPUs) stay
Pending, as Ray's actor would: the status says so (``PodsScheduled`` False with the scheduler's
message, ``unschedulable`` naming what they lack, which ``kubectl get mxd`` shows), an Event
says it when it starts and when they are placed."""

from __future__ import annotations

from unit.operator.objects import UID

from modelplex_operator.status import (OK, PODS_SCHEDULED, DeploymentView, Outcome, PodView, Resource, compute_status,
                                       condition, pod_view, short_unschedulable, transitions)

T0 = "2026-01-01T00:00:00Z"
GPU = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
       "1 No preemption victims found for incoming pod.")


def pending_pod(name: str, message: str = GPU) -> dict:
    """A replica pod as the API shows it when the scheduler found no node for it."""
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def test_a_pod_the_scheduler_cannot_place_carries_its_message_and_others_carry_none():
    assert pod_view(pending_pod("recs-replica-0")).unschedulable == GPU
    scheduled = {"metadata": {"name": "r"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True"}]}}
    # Scheduled but not yet placed for another reason (a gate): not the scheduler's verdict.
    gated = {"metadata": {"name": "r"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}
    assert pod_view(scheduled).unschedulable == "" and pod_view(gated).unschedulable == ""


def test_what_kubectl_shows_is_the_resource_the_nodes_lack_else_the_schedulers_first_clause():
    assert short_unschedulable(GPU) == "nvidia.com/gpu"
    assert short_unschedulable("0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient memory.") == "cpu, memory"
    assert short_unschedulable("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. "
                               "preemption: 0/1 nodes") == "1 node(s) didn't match Pod's node affinity/selector"


def status_with(pods: list[PodView], before: dict | None = None) -> dict:
    resource = Resource(name="recs", namespace="team-a", uid=UID, generation=1, spec=None, status=before or {})
    deployments = [DeploymentView("recs-replica", "replica", 1, 1, 1, 1, 0, 1, 0),
                   DeploymentView("recs-router", "router", 1, 1, 1, 1, 0, 1, 0)]
    return compute_status(resource, deployments, pods, Outcome(UID, 1, OK, "Reconciled"), T0)


def test_pending_gpu_pods_make_the_condition_false_and_name_the_resource_then_clear_once_placed():
    placed = status_with([PodView("recs-replica-0", ready=True)])
    assert condition(placed, PODS_SCHEDULED)["status"] == "True" and placed["unschedulable"] is None
    waiting = status_with([pod_view(pending_pod("recs-replica-1")), pod_view(pending_pod("recs-replica-0"))], placed)
    cond = condition(waiting, PODS_SCHEDULED)
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == f"2 replica pod(s) Pending, no node can take them: {GPU}"
    assert waiting["unschedulable"] == "nvidia.com/gpu"
    assert ("Warning", "Unschedulable", cond["message"]) in transitions(placed, waiting)
    assert transitions(waiting, status_with([pod_view(pending_pod("recs-replica-0"))], waiting)) == []
    again = status_with([PodView("recs-replica-0", ready=True)], waiting)
    assert again["unschedulable"] is None  # a merge patch drops the field
    assert ("Normal", "Scheduled", "the replica pods that waited for a node are placed") in transitions(waiting, again)
    # A pod being deleted while Pending is no news.
    assert condition(status_with([PodView("r", deleting=True, unschedulable=GPU)]), PODS_SCHEDULED)["status"] == "True"
