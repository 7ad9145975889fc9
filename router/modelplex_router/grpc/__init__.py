"""The Open Inference Protocol over gRPC on the router: Triton's ``inference.GRPCInferenceService``
(the KServe v2 predict RPCs, the repository extension, ``ModelStreamInfer``) and the standard
gRPC health service, served by grpcio's asyncio server on the router's event loop.

Requests take the same path as the REST protocol's (:mod:`modelplex_router.oip`): the same
proxy, scheduler, queue bounds and metrics (``protocol="grpc"``); errors are the JSON error's
message under the gRPC status that :mod:`modelplex_router.grpc.status` maps its HTTP status to.
"""
