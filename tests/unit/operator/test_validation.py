"""What the schema cannot check, the operator refuses with a message naming field and value."""

from __future__ import annotations

import pytest
from unit.operator.objects import body

from modelplex.wire.spec import SpecError
from modelplex_operator.validation import plain, problems_of, validate


def test_a_valid_resource():
    deployment = validate(body())
    assert deployment.name == "recs" and deployment.namespace == "team-a"
    assert deployment.spec.batching.max_batch_size == 8


@pytest.mark.parametrize(
    "doc, expected",
    [
        (body(modelSource={"uri": "ftp://models/{model_id}"}), "spec.modelSource.uri: scheme must be one of"),
        (body(modelSource={"uri": "gs://b/{model_id}"}), "(got 'gs')"),
        (body(name="x" * 51), "metadata.name: must be a DNS label of at most 50 characters"),
        (body(name="1recs"), "metadata.name: must start with a letter"),
        (body(handler=None, modelSource=None), "modelSource is required when no handler is given"),
    ],
)
def test_refused_with_a_message_that_says_what_is_wrong(doc, expected):
    doc["spec"] = {k: v for k, v in doc["spec"].items() if v is not None}
    with pytest.raises(SpecError) as caught:
        validate(doc)
    assert expected in problems_of(caught.value)


def test_what_the_schema_also_refuses_is_refused_here_too():
    # A client that skips the apiserver's checks (or an old stored object) still gets a clear answer.
    for spec, expected in (
        ({"batching": {"maxBatchSize": 0}}, "spec.batching.maxBatchSize"),
        ({"replicas": -1}, "spec.replicas"),
        ({"bogus": 1}, "spec.bogus: unknown field"),
    ):
        with pytest.raises(SpecError) as caught:
            validate(body(**spec))
        assert expected in problems_of(caught.value)
    doc = body()
    del doc["spec"]["image"]
    with pytest.raises(SpecError, match="spec.image: required"):
        validate(doc)


def test_plain_copies_read_only_mappings():
    from types import MappingProxyType

    frozen = MappingProxyType({"a": MappingProxyType({"b": [1, MappingProxyType({"c": 2})]})})
    assert plain(frozen) == {"a": {"b": [1, {"c": 2}]}}
    assert type(plain(frozen)["a"]) is dict
