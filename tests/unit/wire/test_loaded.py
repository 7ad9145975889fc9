"""The loaded-models contract: a full document for the endpoint, a fixed-size summary for
annotations and headers, both parsed strictly."""

from __future__ import annotations

import pytest

from modelplex.wire.loaded import (MAX_DOCUMENT_BYTES, MAX_ERROR_CHARS, MAX_FAILURES, LoadedModels, LoadedSummary,
                                   LoadFailure, annotation_summary, read_document, summary_annotations)
from modelplex.wire.names import ANNOTATION_LOADED_MODELS


def test_the_summary_stays_small_whatever_the_models_and_their_ids():
    ids = tuple(f"org-{i}/" + "x" * 190 for i in range(5000))
    document = LoadedModels(version=12345, capacity=8, models=ids[:8], loading=ids[8:],
                            model_bytes={m: 20 << 20 for m in ids[:8]}, capacity_bytes=200 << 20)
    header = document.summary().to_json()
    assert len(header) < 200, header
    assert LoadedSummary.parse(header) == LoadedSummary(12345, 8, 4992, 8, 8 * (20 << 20), 200 << 20)


def test_the_document_round_trips_through_json():
    document = LoadedModels(version=3, capacity=2, models=("a", "meta-llama/Llama-2-7b-hf"), loading=("c",),
                            model_bytes={"a": 10, "meta-llama/Llama-2-7b-hf": 20})
    from modelplex.http import to_json

    assert LoadedModels.parse(to_json(document.to_dict())) == document
    assert document.bytes == 30


def test_load_failures_round_trip_and_stay_bounded():
    failures = tuple(LoadFailure(f"m{i}", "boom", "2026-01-01T00:00:00Z", count=i + 1) for i in range(3))
    document = LoadedModels(version=4, models=("a",), failures=failures)
    assert LoadedModels.parse(document.to_dict()) == document
    assert document.summary() == LoadedSummary(4, 1)  # the summary stays fixed-size
    many = {"failures": [{"model": f"m{i}", "error": "x" * 10_000, "at": "", "count": 1} for i in range(100)]}
    parsed = LoadedModels.parse(many)
    assert len(parsed.failures) == MAX_FAILURES and parsed.failures[-1].model == "m99"
    assert len(parsed.failures[0].error) == MAX_ERROR_CHARS


def test_a_document_of_an_older_replica_without_failures_still_parses():
    old = '{"version": 2, "capacity": 3, "models": ["a"], "loading": [], "modelBytes": {"a": 5}, "capacityBytes": 0}'
    assert LoadedModels.parse(old) == LoadedModels(2, 3, ("a",), (), {"a": 5})


@pytest.mark.parametrize("raw, field", [
    ("[]", "object"),
    ('{"version": -1}', "version"),
    ('{"version": "7"}', "version"),
    ('{"models": 3}', "models"),
    ('{"models": [1]}', "models"),
    ('{"modelBytes": {"a": -5}}', "modelBytes"),
    ('{"failures": {"a": 1}}', "failures"),
    ('{"failures": [{"model": 1}]}', "failures"),
    ('{"failures": [{"model": "a", "count": 0}]}', "failures"),
])
def test_a_malformed_document_is_refused_with_the_field_named(raw, field):
    with pytest.raises(ValueError, match=field):
        LoadedModels.parse(raw)


def test_a_malformed_summary_is_refused():
    for raw in ("not json", '{"models": ["a"]}', '{"version": true}'):
        with pytest.raises(ValueError):
            LoadedSummary.parse(raw)


def test_a_document_body_over_the_size_limit_is_refused_before_parsing():
    body = b'{"models": ["' + b"x" * MAX_DOCUMENT_BYTES + b'"]}'
    with pytest.raises(ValueError, match=f"over {MAX_DOCUMENT_BYTES} bytes"):
        read_document(body)
    assert read_document(b'{"version": 2, "models": ["a"]}') == LoadedModels(version=2, models=("a",))


def test_the_annotation_written_is_the_annotation_read():
    summary = LoadedSummary(7, 2, 1, 4, 300, 1 << 30)
    annotations = summary_annotations(summary)
    assert list(annotations) == [ANNOTATION_LOADED_MODELS]
    assert annotation_summary({"other": "x", **annotations}) == summary


def test_a_pod_without_the_annotation_holds_nothing_and_a_malformed_one_is_refused_by_name():
    assert annotation_summary(None) == LoadedSummary()
    assert annotation_summary({ANNOTATION_LOADED_MODELS: ""}) == LoadedSummary()
    for raw in ("{not json", '["a"]', '{"version": "x"}'):
        with pytest.raises(ValueError, match=ANNOTATION_LOADED_MODELS):
            annotation_summary({ANNOTATION_LOADED_MODELS: raw})
