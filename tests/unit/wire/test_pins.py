"""Pinned copies: the placement every router and the operator compute, and the pin request."""

import pytest

from modelplex.wire.pins import LEASE_S, PinRequest, place_pins, shortfall_message


def test_each_pinned_id_gets_its_copies_on_distinct_replicas():
    placement = place_pins({"a": 2, "b": 1}, {"r0": 4, "r1": 4, "r2": 4})
    assert len(placement.holders("a")) == 2 and len(placement.holders("b")) == 1
    assert placement.missing == {}


def test_two_routers_with_the_same_view_place_the_same_way_whatever_the_order():
    first = place_pins({"a": 1, "b": 2, "c": 1}, {"r0": 2, "r1": 2, "r2": 2})
    second = place_pins({"c": 1, "a": 1, "b": 2}, {"r2": 2, "r0": 2, "r1": 2})
    assert first == second


def test_a_replica_that_comes_back_under_its_name_gets_back_its_copies():
    before = place_pins({f"m{i}": 1 for i in range(12)}, {"r0": 8, "r1": 8, "r2": 8})
    without = place_pins({f"m{i}": 1 for i in range(12)}, {"r0": 8, "r2": 8})
    after = place_pins({f"m{i}": 1 for i in range(12)}, {"r0": 8, "r1": 8, "r2": 8})
    assert after == before
    assert "r1" not in without.replicas and without.missing == {}
    # Only r1's copies moved while it was away: the others stayed where they were.
    for model in before.replicas["r0"]:
        assert without.holders(model) == ["r0"]


def test_pins_never_take_more_slots_than_a_replica_has_and_spill_to_the_next():
    placement = place_pins({f"m{i}": 1 for i in range(4)}, {"r0": 2, "r1": 2})
    assert sorted(len(models) for models in placement.replicas.values()) == [2, 2]
    assert placement.missing == {}


def test_more_copies_than_replicas_is_missing_with_a_message_naming_the_model():
    placement = place_pins({"big": 3, "ok": 1}, {"r0": 2, "r1": 2})
    assert placement.missing == {"big": 1}
    assert len(placement.holders("big")) == 2
    message = shortfall_message({"big": 3, "ok": 1}, placement.missing, 2)
    assert "big: 2/3 copies placed" in message and "2 ready replica(s)" in message and "ok" not in message


def test_more_pinned_copies_than_slots_is_missing():
    placement = place_pins({"a": 2, "b": 2, "c": 2}, {"r0": 2, "r1": 2})
    assert sum(placement.missing.values()) == 2


def test_an_unknown_capacity_bounds_nothing():
    placement = place_pins({f"m{i}": 1 for i in range(10)}, {"r0": 0})
    assert len(placement.replicas["r0"]) == 10


def test_a_pin_request_round_trips_and_drops_repeated_ids():
    request = PinRequest.from_dict({"models": ["a", "b", "a"], "ttlSeconds": 12, "wait": True})
    assert request == PinRequest(("a", "b"), 12.0, True)
    assert PinRequest.from_dict(request.to_dict()) == request
    assert PinRequest.from_dict({"models": []}).ttl_s == LEASE_S


@pytest.mark.parametrize("body, field", [
    ([], "JSON object"),
    ({"models": "a"}, "models"),
    ({"models": ["a\nb"]}, "models"),
    ({"models": ["a"], "ttlSeconds": 0}, "ttlSeconds"),
    ({"models": ["a"], "ttlSeconds": True}, "ttlSeconds"),
    ({"models": ["a"], "ttlSeconds": 1e9}, "ttlSeconds"),
    ({"models": ["a"], "wait": "yes"}, "wait"),
    ({"models": ["a"] * 1001}, "at most"),
])
def test_a_wrong_pin_request_is_refused_naming_the_field(body, field):
    with pytest.raises(ValueError) as refused:
        PinRequest.from_dict(body)
    assert field in str(refused.value)
