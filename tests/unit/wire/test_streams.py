"""The frame that ends a failed stream: written once for SSE and NDJSON, and told apart from records."""

from __future__ import annotations

import json

from modelplex.wire.errors import ReplicaFailed
from modelplex.wire.streams import SSE_ERROR_EVENT, ndjson_error_frame, sse_error_frame, stream_error

ERROR = ReplicaFailed("recs: replica r0 went away")


def test_the_sse_frame_is_an_error_event_holding_the_error_document():
    lines = sse_error_frame(ERROR).decode().split("\n")
    assert lines[0] == f"event: {SSE_ERROR_EVENT}" and lines[2:] == ["", ""]
    data = json.loads(lines[1].removeprefix("data: "))
    assert stream_error(SSE_ERROR_EVENT, data) == {"code": "replica_failed", "message": "recs: replica r0 went away"}


def test_the_ndjson_frame_is_one_line_of_the_error_document():
    frame = ndjson_error_frame(ERROR)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert stream_error("", json.loads(frame))["code"] == "replica_failed"


def test_records_that_are_not_the_error_frame_are_not_errors():
    assert stream_error("", {"chunk": 1}) is None
    assert stream_error("message", ERROR.to_dict()) is None
    assert stream_error("", {"error": "a handler's own field"}) is None
