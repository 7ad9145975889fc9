"""The router as a Gateway API Inference Extension Endpoint Picker (EPP): a third front over the
:class:`~modelplex_router.router.Router`, beside HTTP and gRPC. A Gateway (Envoy, Istio,
kgateway, GKE) asks it over Envoy's external processing protocol (ext_proc) which replica takes
each request, and carries the bytes itself; the picker makes the router's decisions
(:mod:`modelplex_router.picker.service`) and answers what is not for a replica
(:mod:`modelplex_router.picker.answers`). Served on ``spec.router.endpointPicker.port`` when
``spec.router.endpointPicker.enabled`` (:mod:`modelplex_router.picker.server`).
"""
