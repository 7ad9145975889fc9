"""The loaded-models contract: a full document for the endpoint, a fixed-size summary for
annotations and headers, both parsed strictly."""

from __future__ import annotations

import pytest

from modelplex.loaded import LoadedModels, LoadedSummary


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


@pytest.mark.parametrize("raw, field", [
    ("[]", "object"),
    ('{"version": -1}', "version"),
    ('{"version": "7"}', "version"),
    ('{"models": 3}', "models"),
    ('{"models": [1]}', "models"),
    ('{"modelBytes": {"a": -5}}', "modelBytes"),
])
def test_a_malformed_document_is_refused_with_the_field_named(raw, field):
    with pytest.raises(ValueError, match=field):
        LoadedModels.parse(raw)


def test_a_malformed_summary_is_refused():
    for raw in ("not json", '{"models": ["a"]}', '{"version": true}'):
        with pytest.raises(ValueError):
            LoadedSummary.parse(raw)
