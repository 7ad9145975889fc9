"""The protocol's message classes, built at import from the vendored descriptor set
(``vendor/inference.binpb``, from Triton's ``grpc_service.proto``).

They live in a descriptor pool of their own, not protobuf's default one: a process that also
imports a client's generated stubs of the same proto (tritonclient's, KServe's) sees no clash.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE_NAME = f"{PACKAGE}.GRPCInferenceService"
DESCRIPTOR_SET = "inference.binpb"


def _pool() -> descriptor_pool.DescriptorPool:
    data = resources.files(__package__).joinpath("vendor", DESCRIPTOR_SET).read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    return pool


POOL = _pool()
SERVICE = POOL.FindServiceByName(SERVICE_NAME)


def message(name: str) -> Any:
    """The class of message ``inference.<name>``."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ServerLiveRequest = message("ServerLiveRequest")
ServerLiveResponse = message("ServerLiveResponse")
ServerReadyRequest = message("ServerReadyRequest")
ServerReadyResponse = message("ServerReadyResponse")
ModelReadyRequest = message("ModelReadyRequest")
ModelReadyResponse = message("ModelReadyResponse")
ServerMetadataRequest = message("ServerMetadataRequest")
ServerMetadataResponse = message("ServerMetadataResponse")
ModelMetadataRequest = message("ModelMetadataRequest")
ModelMetadataResponse = message("ModelMetadataResponse")
ModelInferRequest = message("ModelInferRequest")
ModelInferResponse = message("ModelInferResponse")
ModelStreamInferResponse = message("ModelStreamInferResponse")
InferParameter = message("InferParameter")
InferTensorContents = message("InferTensorContents")
RepositoryIndexRequest = message("RepositoryIndexRequest")
RepositoryIndexResponse = message("RepositoryIndexResponse")
RepositoryModelLoadRequest = message("RepositoryModelLoadRequest")
RepositoryModelLoadResponse = message("RepositoryModelLoadResponse")
RepositoryModelUnloadRequest = message("RepositoryModelUnloadRequest")
RepositoryModelUnloadResponse = message("RepositoryModelUnloadResponse")
