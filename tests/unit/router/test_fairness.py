"""The weighted fair order between models' waiting requests (pure: no sockets, no clock)."""

from __future__ import annotations

from collections import Counter

from modelplex_router.fairness import FairLine


def serve(line: FairLine[str], slots: int) -> list[str]:
    """Hand ``slots`` slots out in the line's order (each to the next model's oldest waiter)."""
    served = []
    for _ in range(slots):
        order = line.order()
        if not order:
            break
        model = order[0]
        waiter = line.waiters(model)[0]
        line.remove(model, waiter)
        line.served(model)
        served.append(waiter)
    return served


def flooded(line: FairLine[str], **counts: int) -> None:
    """``counts[model]`` waiters per model, every model's waiters added before the next model's."""
    for model, count in counts.items():
        for i in range(count):
            line.add(model, f"{model}{i}")


def test_a_single_request_for_another_model_is_served_next_not_behind_a_flood():
    line: FairLine[str] = FairLine()
    flooded(line, a=64)
    serve(line, 3)
    line.add("b", "b0")  # arrives behind 61 waiting requests for a
    assert serve(line, 2) == ["b0", "a3"]


def test_first_come_first_served_keeps_the_late_request_behind_the_flood():
    line: FairLine[str] = FairLine(fair=False)
    flooded(line, a=64)
    line.add("b", "b0")
    assert serve(line, 65)[-1] == "b0"


def test_models_share_slots_in_proportion_to_their_weights():
    weights = {"a": 1.0, "b": 3.0}
    line: FairLine[str] = FairLine(lambda model: weights[model])
    flooded(line, a=100, b=100)
    shares = Counter(waiter[0] for waiter in serve(line, 80))
    assert shares == {"a": 20, "b": 60}


def test_equal_weights_alternate_between_models():
    line: FairLine[str] = FairLine()
    flooded(line, a=5, b=5)
    assert serve(line, 6) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_model_alone_takes_every_slot_whatever_its_weight():
    line: FairLine[str] = FairLine(lambda model: 0.01)
    flooded(line, a=10)
    assert serve(line, 10) == [f"a{i}" for i in range(10)]
    assert len(line) == 0 and line.order() == []


def test_a_model_that_was_idle_banks_no_credit():
    line: FairLine[str] = FairLine()
    flooded(line, a=3)
    serve(line, 3)  # a alone for a while, then b floods
    flooded(line, b=10)
    line.add("a", "a-late")
    # a is behind b by no more than one round: it gets every other slot, not all of the next ones.
    assert serve(line, 4) == ["b0", "a-late", "b1", "b2"]


def test_a_model_is_served_oldest_first_and_waiters_can_leave():
    line: FairLine[str] = FairLine()
    flooded(line, a=3)
    line.remove("a", "a1")  # timed out
    line.remove("a", "nobody")  # unknown waiters are ignored
    assert line.waiting("a") == 2 and len(line) == 2
    assert serve(line, 5) == ["a0", "a2"]
    assert list(line.models()) == []


def test_the_waiting_counts_are_per_model():
    line: FairLine[str] = FairLine()
    flooded(line, a=4, b=1)
    assert dict(line.models()) == {"a": 4, "b": 1} and len(line) == 5
