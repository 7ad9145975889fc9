"""Which failures of the real ``kubernetes`` client are worth a retry, against a real HTTP server
on loopback: the server's answers by status, no answer at all (refused, timed out) — and a bug,
which leaves as itself instead of becoming a retry."""

from __future__ import annotations

import socket

import pytest
import urllib3.exceptions
from kubernetes.client.rest import ApiException

from modelplex_operator.kube import NO_ANSWER, Kube, KubeError

from support.apiserver import kube_at


def config_map(**data) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": data}


def kube_error(kube: Kube) -> KubeError:
    with pytest.raises(KubeError) as caught:
        kube.apply(config_map(a="1"), owner_uid="u1")
    return caught.value


def ours(**data) -> dict:
    """The ConfigMap as the API answers it once the operator made it (controlled by ``u1``)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": data, "metadata": {
        "name": "c", "namespace": "ns", "resourceVersion": "3",
        "ownerReferences": [{"kind": "MultiplexedDeployment", "name": "recs", "uid": "u1", "controller": True}]}}


@pytest.mark.parametrize("status", [409, 429, 403, 408, 500, 502, 503, 504])
def test_answers_a_retry_can_help_are_retryable_and_keep_the_servers_answer_as_cause(api, status):
    # It exists (409 to the create), is ours but out of step: the apply gets the answer.
    api.answers = [(409, "exists"), (200, ours(a="0")), (status, f"try again ({status})")]
    error = kube_error(api.kube())
    assert error.retryable and error.status == status
    assert error.message == f"try again ({status})" and error.what == "apply ConfigMap c"
    assert isinstance(error.__cause__, ApiException) and error.__cause__.status == status
    assert [(r.method, r.path) for r in api.requests] == [
        ("POST", "/api/v1/namespaces/ns/configmaps?fieldManager=modelplex-operator"),
        ("GET", "/api/v1/namespaces/ns/configmaps/c"),
        ("PATCH", "/api/v1/namespaces/ns/configmaps/c?fieldManager=modelplex-operator&force=true")]


@pytest.mark.parametrize("status", [400, 401, 404, 410, 415, 422])
def test_answers_that_fail_the_same_way_again_are_not_retryable(api, status):
    api.answers = [(status, "refused")]
    error = kube_error(api.kube())
    assert not error.retryable and error.status == status and error.message == "refused"
    assert error.what == "create ConfigMap c" and isinstance(error.__cause__, ApiException)


def test_a_refused_connection_is_no_answer_and_retryable():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        error = kube_error(kube_at(f"http://127.0.0.1:{port}"))
    assert error.status == NO_ANSWER and error.retryable
    assert isinstance(error.__cause__, urllib3.exceptions.MaxRetryError)
    assert "no answer" in str(error) and "create ConfigMap c" in str(error)


def test_a_server_that_never_answers_times_out_as_no_answer_and_retryable():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel accepts the connection; nobody ever reads or answers
        error = kube_error(kube_at(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3))
    assert error.status == NO_ANSWER and error.retryable
    assert isinstance(error.__cause__, (urllib3.exceptions.HTTPError, OSError))


def test_a_bug_in_the_call_surfaces_as_itself_not_as_a_retry(api):
    kube = api.kube()
    # An object the client cannot serialize: a programming error, which no retry would heal.
    with pytest.raises(AttributeError):
        kube.apply(config_map(a=object()), owner_uid="u1")
    assert api.requests == []  # the create never left


def test_a_get_of_a_missing_object_is_none_and_any_other_answer_an_error(api):
    kube = api.kube()
    api.answers = [(404, "gone")]
    assert kube.get("v1", "ConfigMap", "ns", "c") is None
    api.answers = [(200, "")]
    assert kube.get("v1", "ConfigMap", "ns", "c")["metadata"]["name"] == "c"
    api.answers = [(503, "etcd unavailable")]
    with pytest.raises(KubeError, match="get ConfigMap c: 503 Reason503: etcd unavailable") as caught:
        kube.get("v1", "ConfigMap", "ns", "c")
    assert caught.value.retryable
