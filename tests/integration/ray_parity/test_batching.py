"""Batching in a deployment, as Ray's test_batching.py checks it beyond its unit cases:
concurrent batches, callers that give up, batching by size (``batch_size_fn``), and a request
too large for any batch. The cases that share batches, fail on a non-list answer, take several
arguments or stream to HTTP clients are in test_handles.py and test_http_streaming.py."""

import asyncio

import pytest

from modelplex import handle
from modelplex.wire.errors import BadRequest


def batched(stack):
    return handle("batched", url=stack.url("batched"))


async def test_up_to_max_concurrent_batches_run_at_once(stack):
    answers = await asyncio.gather(*(batched(stack).concurrent.remote(i) for i in range(20)))
    assert sorted(request for request, _, _ in answers) == list(range(20))
    assert max(batches for _, batches, _ in answers) == 2  # two at once, never more
    assert max(requests for _, _, requests in answers) == 10


async def test_callers_that_give_up_leave_the_batcher_working(stack):
    h = batched(stack)
    for _ in range(3):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(h.quick.remote(1), 0.005)
    assert await h.quick.remote(1) == "fake-response"

    for _ in range(3):
        stream = h.options(stream=True).digits.remote(1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stream.__anext__(), 0.005)
    assert "".join([digit async for digit in h.options(stream=True).digits.remote(1)]) == "0123456789"


async def sized(stack, method, requests):
    """Send ``requests`` at once to a batch_size_fn method; its answers and the sizes of the batches it ran."""
    h = batched(stack)
    before = len(await h.batch_sizes_by_size_fn.remote())
    answers = await asyncio.gather(*(getattr(h, method).remote(request) for request in requests))
    return answers, (await h.batch_sizes_by_size_fn.remote())[before:]


async def test_batch_size_fn_keeps_each_batch_within_max_batch_size(stack):
    requests = [{"size": size, "value": value} for size, value in ((30, 2), (40, 4), (20, 6), (25, 8))]
    answers, sizes = await sized(stack, "by_size", requests)
    assert answers == [2, 4, 6, 8]
    assert sum(sizes) == 115 and all(size <= 100 for size in sizes), sizes


async def test_batch_size_fn_runs_small_and_large_requests_alike(stack):
    tokens = [10, 20, 50, 15, 90, 5]
    answers, sizes = await sized(stack, "by_size", [{"size": n, "value": f"processed_{i}"} for i, n in enumerate(tokens)])
    assert answers == [f"processed_{i}" for i in range(len(tokens))]
    assert sum(sizes) == sum(tokens) and all(size <= 100 for size in sizes), sizes


async def test_batch_size_fn_defers_what_does_not_fit_to_a_later_batch(stack):
    requests = [{"size": size, "value": value} for size, value in ((6, "a"), (6, "b"), (3, "c"), (4, "d"))]
    answers, sizes = await sized(stack, "by_size_10", requests)
    assert answers == ["a", "b", "c", "d"]
    assert sum(sizes) == 19 and all(size <= 10 for size in sizes), sizes


def graph(num_nodes: int, graph_id: int) -> dict:
    """Ray's ``Graph(num_nodes, graph_id)`` as JSON: its nodes and the edges of a path through them."""
    return {"graph_id": graph_id, "nodes": list(range(num_nodes)),
            "edges": [[node, node + 1] for node in range(num_nodes - 1)]}


async def test_batch_size_fn_by_graph_nodes(stack):
    """Ray's test_batch_size_fn_graph_nodes: 30 + 40 + 35 nodes exceed 100, so the graphs take
    more than one batch, each within 100 nodes."""
    answers, sizes = await sized(stack, "process_graphs", [graph(30, 1), graph(40, 2), graph(35, 3), graph(50, 4)])
    assert answers == [30, 80, 105, 200]
    assert sum(sizes) == 155 and len(sizes) >= 2 and all(size <= 100 for size in sizes), sizes


async def test_batch_size_fn_by_tokens(stack):
    sequences = ["This is a short sequence", "This is a much longer sequence with many more words in it",
                 "Short", "A B C D E F G H I J"]
    assert await asyncio.gather(*(batched(stack).by_tokens.remote(s) for s in sequences)) == [5, 12, 1, 10]


async def test_a_request_larger_than_any_batch_fails_alone(stack, session):
    url = stack.url("streaming-app") + "/sized"
    async with session.post(url, json={"size": 15, "value": "too_large"}) as response:
        assert response.status == 500  # raised inside the FastAPI route, answered by FastAPI
    async with session.post(url, json={"size": 5, "value": "fits"}) as response:
        assert (response.status, await response.json()) == (200, "fits")
    # Through a handle it is the caller's mistake: a BadRequest (400), as over plain HTTP.
    with pytest.raises(BadRequest, match="larger than max_batch_size"):
        await batched(stack).by_size_10.remote({"size": 15, "value": "too_large"})
