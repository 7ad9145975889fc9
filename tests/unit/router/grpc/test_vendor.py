"""The vendored proto: its descriptor set is what protoc makes of the .proto files, it keeps its
licence, and the service has every RPC the router serves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2

from modelplex_router.grpc import messages
from modelplex_router.grpc.service import InferenceService
from modelplex_router.grpc.status import CODES, code_for, retry_metadata

VENDOR = Path(messages.__file__).resolve().parent / "vendor"
SERVED = {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
          "ModelStreamInfer", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"}


def test_the_descriptor_set_is_protoc_s_output_for_the_vendored_protos(tmp_path):
    out = tmp_path / "inference.binpb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(VENDOR), "--include_imports",
                    f"--descriptor_set_out={out}", str(VENDOR / "grpc_service.proto")], check=True)
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    vendored = descriptor_pb2.FileDescriptorSet.FromString((VENDOR / messages.DESCRIPTOR_SET).read_bytes())
    assert fresh == vendored, "regenerate vendor/inference.binpb (see vendor/README.md)"


def test_the_vendored_files_keep_their_licence():
    assert "Redistribution and use in source and binary forms" in (VENDOR / "LICENSE").read_text()
    for proto in ("grpc_service.proto", "model_config.proto"):
        assert "NVIDIA CORPORATION" in (VENDOR / proto).read_text().splitlines()[0]


def test_the_service_serves_the_kserve_rpcs_and_triton_s_repository_and_streaming():
    methods = {m.name for m in messages.SERVICE.methods}
    assert SERVED <= methods
    assert {name for name in SERVED if callable(getattr(InferenceService, name, None))} == SERVED
    stream = messages.SERVICE.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming


def test_error_statuses_map_to_grpc_codes_once():
    assert code_for(400) is grpc.StatusCode.INVALID_ARGUMENT
    assert code_for(404) is grpc.StatusCode.NOT_FOUND
    assert code_for(503) is grpc.StatusCode.UNAVAILABLE
    assert code_for(504) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert code_for(418) is grpc.StatusCode.FAILED_PRECONDITION  # a 4xx the table does not name
    assert code_for(599) is grpc.StatusCode.INTERNAL
    assert all(400 <= status < 600 for status in CODES)
    assert retry_metadata(None) == () and retry_metadata(0.2) == (("retry-after", "1"),)
