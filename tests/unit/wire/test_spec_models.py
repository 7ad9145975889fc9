"""``spec.models`` and ``spec.router.loadQuota``: per-model placement and sharing, parsed once."""

from __future__ import annotations

import pytest

from modelplex.wire.spec import DEFAULT_LOAD_QUOTA_BURST, DEFAULT_MODEL_ENTRY, SpecError, parse_spec

BASE = {"image": "img", "handler": "pkg.mod:Handler"}


def spec_with(**fields):
    return parse_spec({**BASE, **fields})


def test_the_first_matching_entry_applies_and_an_id_matching_none_gets_the_defaults():
    spec = spec_with(models=[{"match": "hot", "minCopies": 2, "weight": 4},
                             {"match": "cust-*", "onCold": "reject", "maxCopies": 3},
                             {"match": "cust-vip", "weight": 9}])
    assert spec.model_entry("hot").weight == 4
    assert spec.model_entry("cust-vip").on_cold == "reject"  # the glob comes first
    assert spec.model_entry("cust-vip").max_copies == 3
    assert spec.model_entry("other") == DEFAULT_MODEL_ENTRY
    assert (DEFAULT_MODEL_ENTRY.weight, DEFAULT_MODEL_ENTRY.on_cold, DEFAULT_MODEL_ENTRY.min_copies) == (1.0, "hold", 0)
    assert spec.pinned_models == {"hot": 2}


def test_an_exact_match_does_not_read_its_id_as_a_pattern_prefix():
    spec = spec_with(models=[{"match": "m1", "weight": 2}])
    assert spec.model_entry("m10") == DEFAULT_MODEL_ENTRY


@pytest.mark.parametrize("models, message", [
    ([{"match": "a*", "minCopies": 1}], "spec.models.0: minCopies needs one model id, not a glob"),
    ([{"match": "a", "minCopies": 3, "maxCopies": 2}], "maxCopies (2) is below minCopies (3)"),
    ([{"match": "a"}, {"match": "a"}], "models: a listed more than once"),
    ([{"match": "a", "onCold": "drop"}], "spec.models.0.onCold"),
    ([{"match": "a", "weight": 0}], "spec.models.0.weight"),
    ([{"minCopies": 1}], "spec.models.0.match"),
])
def test_a_bad_entry_is_refused_naming_the_field(models, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        spec_with(models=models)


def test_a_load_quota_needs_a_rate_and_defaults_its_burst():
    assert spec_with(router={"loadQuota": {"loadsPerMinute": 30}}).router.load_quota.burst == DEFAULT_LOAD_QUOTA_BURST
    with pytest.raises(SpecError, match="spec.router.loadQuota.loadsPerMinute"):
        spec_with(router={"loadQuota": {"burst": 3}})
    assert spec_with().router.load_quota is None
