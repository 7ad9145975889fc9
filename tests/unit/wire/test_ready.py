"""Local mode's ready file: its shape round-trips, readers tolerate what later writers add, and it appears whole."""

from __future__ import annotations

import json

import pytest

from modelplex.wire.ready import VERSION, ReadyDeployment, ReadyFile, read_ready_file, write_ready_file

READY = ReadyFile((ReadyDeployment("alpha", "http://127.0.0.1:8000", "127.0.0.1:50051"),
                   ReadyDeployment("beta", "http://[::1]:8001", "[::1]:50052", control="[::1]:9001")))


def test_a_ready_file_reads_back_as_it_was_written():
    assert ReadyFile.from_json(READY.to_json()) == READY


def test_urls_and_grpc_addresses_are_by_deployment_name():
    assert READY.urls == {"alpha": "http://127.0.0.1:8000", "beta": "http://[::1]:8001"}
    assert READY.grpc == {"alpha": "127.0.0.1:50051", "beta": "[::1]:50052"}


def test_fields_a_later_writer_adds_are_ignored_and_missing_optional_ones_read_as_none():
    text = json.dumps({"version": VERSION, "extra": 1,
                       "deployments": [{"name": "a", "url": "http://h:1", "grpc": "h:2", "metrics": "h:3"}]})
    assert ReadyFile.from_json(text).deployments == (ReadyDeployment("a", "http://h:1", "h:2", None, None),)


@pytest.mark.parametrize("text, problem", [
    ('{"version": 99, "deployments": []}', "newer"),
    ('{"deployments": [{"name": "a", "url": "http://h:1"}]}', "required"),
    ('{"deployments": [{"name": "a", "url": "http://h:1", "grpc": 5}]}', "grpc: expected a string"),
    ('[]', "expected an object"),
])
def test_a_file_of_another_shape_is_refused_with_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        ReadyFile.from_json(text)


def test_no_file_yet_reads_as_not_ready(tmp_path):
    assert read_ready_file(tmp_path / "ready.json") is None


def test_a_written_file_replaces_the_last_one_whole_and_leaves_no_temporary_beside_it(tmp_path):
    path = tmp_path / "ready.json"
    write_ready_file(path, ReadyFile())
    write_ready_file(path, READY)
    assert read_ready_file(path) == READY
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]
