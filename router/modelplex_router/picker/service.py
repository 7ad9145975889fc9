"""``envoy.service.ext_proc.v3.ExternalProcessor``: the router's decisions for a Gateway.

One ext_proc stream is one HTTP request passing the Gateway. On its request headers the picker
makes the router's decisions through the router's own functions, in the order every front makes
them (:mod:`modelplex_router.door`): the route and the one model id (path or model-id header,
decoded once), model control, credentials and globs (:func:`~modelplex_router.auth.authorize`),
``onCold`` and the load quota (:meth:`~modelplex_router.router.Router.admit`), then the
scheduler's lease on a replica (cache-aware choice, per-model fair order, wait bounds). A
refusal is an ``ImmediateResponse`` with the router's status and JSON body (503 with
``Retry-After`` when nothing can serve or a wait bound is full, 429 for a spent quota). A pick
goes back as one ``ip:port`` in ``x-gateway-destination-endpoint`` (what Envoy's
``ORIGINAL_DST`` cluster reads) and in ``envoy.lb`` dynamic metadata, with what the replica
needs: its path, the model and protocol headers, and a proof that the picker admitted the
request (:mod:`modelplex.wire.proof`) in place of the deployment's credential, which never
leaves the router. The client's own ``x-gateway-destination-endpoint`` and internal headers
are removed (set ones overwritten).

The lease is held until the answer is over (its last body chunk, its trailers, or the end of the
stream), so the scheduler's count of each replica's requests in flight stays true. Header-only,
the picker asks for the answer's trailers (a mode override: Envoy's ``allow_mode_override``),
which keeps the stream open until the answer ends with no byte of it passing the picker;
without the override Envoy closes the stream after the answer's headers, and the slot is freed
then, which is what the picker lets happen for an answer of a stated length (``Content-Length``:
the replica had all of it, its slot free, when it sent the headers; one round trip fewer per
request); the answer's headers tell the table what the replica
holds (its loaded-models summary, which is removed before the client).

Fallbacks (``spec.router.endpointPicker.fallbacks``: N): the ``envoy.lb`` metadata names the pick
and then up to N more replicas, in the order the same policy ranks them for the request
(``ip:port,ip:port,...``, as the EPP protocol's v0.4 allows), for a Gateway whose load balancing
reads such a list and retries down it (Envoy's override-host policy); the header keeps the one
pick, since an ``ORIGINAL_DST`` cluster reads exactly one. The proof then covers each of them
(one per replica). The replica that served the request, where the Gateway says so (the
protocol's ``x-gateway-destination-endpoint-served`` in ``envoy.lb`` metadata, or the
``upstream.address`` response attribute), takes the lease over from the pick, so the count of
requests in flight stays true after a fallback. Bodies: in
``FULL_DUPLEX_STREAMED`` every chunk is echoed byte for byte both ways; in any other mode bodies
pass by the picker (header-only: ``request_body_mode: NONE``).

Requests that are not for a replica (health, server metadata, the repository extension) are
answered by the picker (:mod:`modelplex_router.picker.routes`).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, AsyncIterator
from urllib.parse import parse_qs, urlsplit

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from modelplex.wire.credentials import ACCESS_TOKEN_PARAM, INTERNAL_TOKEN_HEADER
from modelplex.wire.errors import ModelplexError, NotReady
from modelplex.wire.forwarded import METHOD_HEADER, PATH_HEADER
from modelplex.wire.ids import checked_model_id
from modelplex.wire.internal_headers import is_internal_header
from modelplex.wire.names import DASHED_MODEL_ID_HEADER, LOADED_MODELS_HEADER, MODEL_ID_HEADER
from modelplex.wire.oip import PROTOCOL, PROTOCOL_HEADER, VERSION_HEADER, error_body
from modelplex.wire.proof import PROOF_HEADER, endpoint, make_proof
from modelplex_router import oip
from modelplex_router.auth import Asked, authorize
from modelplex_router.browsers import answer_cors_headers, preflight_headers
from modelplex_router.cold import ON_COLD_HEADER, quota_client
from modelplex_router.door import MODEL_CONTROL, Route, header_models, served_model
from modelplex_router.events import Answered as ReplicaAnswered
from modelplex_router.events import RequestStarted, SummaryHeard
from modelplex_router.picker import frames
from modelplex_router.picker.answers import answer_locally
from modelplex_router.picker.routes import Answered, Upstream, classify
from modelplex_router.policy import POLICIES
from modelplex_router.record import Replica
from modelplex_router.relayed import is_bearer, without_param
from modelplex_router.router import Router
from modelplex_router.scheduler import Lease

log = logging.getLogger("modelplex.router.picker")

#: The pick, as Envoy's ``ORIGINAL_DST`` cluster and the EPP protocol read it: one ``ip:port``.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
#: The Gateway's hint: the endpoints the pick must be among (``ip:port`` strings).
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
#: Where the pick goes in the dynamic metadata (``metadata_options.receiving_namespaces``).
LB_NAMESPACE = "envoy.lb"
#: Where a Gateway says which endpoint served the request (``envoy.lb`` metadata, EPP protocol v1).
SERVED_KEY = "x-gateway-destination-endpoint-served"
#: The response attribute with the same fact, for an Envoy that sends it (``response_attributes``).
UPSTREAM_ATTRIBUTE = "upstream.address"
#: The service name, in ``grpc.health.v1`` too.
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class Picker:
    """The ext_proc service over ``router`` (started before, closed after, by its owner)."""

    def __init__(self, router: Router, *, fallbacks: int = 0, wall_clock: Any = time.time):
        self.router = router
        #: ``spec.router.endpointPicker.fallbacks``: replicas named after the pick in ``envoy.lb``.
        self.fallbacks = fallbacks
        self.wall_clock = wall_clock

    async def Process(self, requests: AsyncIterator[ext.ProcessingRequest]  # noqa: N802 (gRPC's name)
                      ) -> AsyncIterator[ext.ProcessingResponse]:
        """The answers to one ext_proc stream's messages, one each, in order."""
        exchange = _Exchange(self)
        try:
            async for message in requests:
                yield await exchange.answer(message)
        finally:
            exchange.finish()


class _Exchange:
    """One HTTP request's ext_proc stream: its decisions, its lease, its metrics."""

    def __init__(self, picker: Picker):
        self.picker = picker
        self.router = picker.router
        self.echo = False  # full-duplex streaming: the picker carries the bodies
        self.oip = False  # a request under /v2: its errors are the protocol's {"error": "..."}
        self.cors: dict[str, str] = {}  # an allowed origin's CORS headers, for the answer
        self.rewriting: bytearray | None = None  # an error answer's body, read to be rewritten
        self.lease: Lease | None = None
        self.fallbacks: list[str] = []  # the endpoints named after the pick, in order
        self.status = 0
        self.model = ""
        self.counted = False
        self.started = time.perf_counter()

    async def answer(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        kind = message.WhichOneof("request")
        if message.HasField("protocol_config"):  # the first message says how bodies travel
            self.echo = message.protocol_config.request_body_mode == frames.FULL_DUPLEX
        if kind == "request_headers":
            return await self._request(message)
        if kind == "response_headers":
            return self._response(message.response_headers, message)
        if kind == "response_body" and self.rewriting is not None:
            return self._rewrite(message.response_body)
        if kind in ("request_body", "response_body"):
            chunk = getattr(message, kind)
            if kind == "response_body" and chunk.end_of_stream:
                self.finish()
            return frames.body(chunk, response=kind == "response_body", echo=self.echo)
        if kind == "response_trailers":
            self.finish()
        return frames.trailers(response=kind == "response_trailers")

    # -- the request ---------------------------------------------------------------------------

    async def _request(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        headers = frames.header_list(message.request_headers.headers)
        named = dict(headers)  # the first of each name: pseudo-headers and the ones read here are single
        method, raw_path = named.get(":method", "GET"), named.get(":path", "/")
        self.oip = is_oip = oip.is_oip_path(raw_path.partition("?")[0])
        origin = named.get("origin")
        if method == "OPTIONS" and origin and "access-control-request-method" in named:
            # A CORS preflight: answered before authentication, as the router does (no credential comes).
            return frames.immediate(204, None, preflight_headers(self.router.config.cors, origin))
        self.cors = answer_cors_headers(self.router.config.cors, origin)
        try:
            target = classify(method, raw_path)
            model = self._model(target, named)
            asked = Asked(target.route, path=raw_path.partition("?")[0], content_type=named.get("content-type", ""),
                          bearer=_bearer(named, method, raw_path), internal_token=named.get(INTERNAL_TOKEN_HEADER.lower()),
                          model=model)
            caller = authorize(self.router.access, asked)
            client = quota_client(caller, _source(message))
            if isinstance(target, Answered):
                return await answer_locally(self.router, target, model, caller, client, method, raw_path,
                                            named.get(ON_COLD_HEADER))
            self._count(model)
            if target.oip or target.version is not None:
                oip.model_version(model, target.version)
            self.router.admit(target.route, model, client, named.get(ON_COLD_HEADER))
            self.lease = lease = await self._pick(model, _subset(message))
            return self._forward(target, lease, headers, method, raw_path, consumed=_consumed(self.router))
        except ModelplexError as error:
            self.status = error.status
            self.finish()
            return frames.refusal(error, oip=is_oip, headers=self.cors)
        except Exception:  # noqa: BLE001 - one request's fault answers that request, as on the other fronts
            log.exception("the picker failed on %s %s", method, raw_path.partition("?")[0])
            self.status = 500
            self.finish()
            return frames.refusal(ModelplexError("internal error; see the router log"), oip=is_oip)

    def _model(self, target: Answered | Upstream, named: dict[str, str]) -> str:
        """The one model id (the router's rule: the path's, else the model-id header's)."""
        if target.route is not Route.MODEL and target.route not in MODEL_CONTROL:
            return ""
        model = served_model(target.path_model, header_models(named))
        return checked_model_id(model) if model else model

    def _count(self, model: str) -> None:
        self.model = model
        self.counted = True
        self.router.metrics.inflight.inc()

    async def _pick(self, model: str, subset: frozenset[str]) -> Lease:
        """A lease on a replica for ``model``, among ``subset`` when the Gateway gave one."""
        router = self.router
        since = router.clock()
        exclude: set[str] | None = None
        if subset:
            allowed = {r.name for r in router.table.usable(since) if _endpoint_of(r) in subset}
            if not allowed:
                raise NotReady(f"none of the endpoints the Gateway allows ({', '.join(sorted(subset))}) is a ready "
                               f"replica of {router.config.deployment!r}", retry_after=1.0)
            exclude = {r.name for r in router.table.replicas() if r.name not in allowed}
        lease = await router.scheduler.acquire(model, exclude, since=since)
        if subset and _endpoint_of(lease.replica) not in subset:
            lease.release(False)  # the line let it go elsewhere: the hint is a bound, not a wish
            raise NotReady(f"no replica the Gateway allows could take the request for {model!r}", retry_after=1.0)
        if self.picker.fallbacks:
            self.fallbacks = [_endpoint_of(r) for r in _ranked_after(router, model, lease.replica, exclude or set(),
                                                                      self.picker.fallbacks)]
        router.metrics.waited(model, router.clock() - since)
        router.metrics.routed(lease.kind, model)
        return lease

    def _forward(self, target: Upstream, lease: Lease, headers: list[tuple[str, str]], method: str, raw_path: str,
                 *, consumed: bool) -> ext.ProcessingResponse:
        picked = _endpoint_of(lease.replica)
        endpoints = [picked, *self.fallbacks]
        sent = {":path": target.path, MODEL_ID_HEADER: lease.model, DESTINATION_HEADER: picked}
        if target.method != method:
            sent[":method"] = target.method  # needs the Gateway's mutation rules to allow routing headers
        if target.forwarded:
            sent[METHOD_HEADER] = method
            sent[PATH_HEADER] = without_param(raw_path, ACCESS_TOKEN_PARAM) if consumed else raw_path
        if target.oip:
            sent[PROTOCOL_HEADER] = PROTOCOL
            if target.version is not None:
                sent[VERSION_HEADER] = target.version
        internal = self.router.access.internal
        credential = internal.token() if internal is not None else None
        if credential is not None:
            now = self.picker.wall_clock()
            sent[PROOF_HEADER] = ",".join(make_proof(credential, lease.model, e, now) for e in endpoints)
        setting = {name.lower() for name in sent}
        remove = {name for name, value in headers
                  if name not in setting and (is_internal_header(name) or name.startswith(DESTINATION_HEADER)
                                              or name == DASHED_MODEL_ID_HEADER
                                              or (consumed and name == "authorization" and is_bearer(value)))}
        return frames.continue_request(sent, sorted(remove), {LB_NAMESPACE: {DESTINATION_HEADER: ",".join(endpoints)}})

    # -- the answer ----------------------------------------------------------------------------

    def _response(self, message: ext.HttpHeaders, request: ext.ProcessingRequest) -> ext.ProcessingResponse:
        headers = frames.header_list(message.headers)
        named = dict(headers)
        self.status = int(named.get(":status", "0") or 0)
        if self.fallbacks and self.lease is not None:
            self._served_by(_served(request))
        lease = self.lease
        if lease is not None:
            now = self.router.clock()
            self.router.table.apply(ReplicaAnswered(lease.replica), now)
            if summary := named.get(LOADED_MODELS_HEADER.lower()):
                self.router.table.apply(SummaryHeard(lease.replica, summary), now)
        if message.end_of_stream:
            self.finish()
        # What components tell each other never reaches a client.
        remove = {name for name, _ in headers if is_internal_header(name)}
        if self.oip and self.status >= 400 and not message.end_of_stream:
            # A replica's (or the Gateway's) error under /v2: its body becomes the protocol's, as
            # the router answers it. Header-only, the Gateway is asked for this answer's body.
            self.rewriting = bytearray()
            remove.add("content-length")
            return frames.continue_response(sorted(remove), read_body=not self.echo, set_headers=self.cors)
        # Header-only, asking for the answer's trailers keeps the stream open until the answer is
        # over (Envoy then sends them, or closes the stream): the slot is held until then. Not for
        # an answer of a stated length: the replica had all of it (its slot was free) when it
        # sent these headers, so the stream may end now, one round trip fewer per request.
        hear_end = not self.echo and not message.end_of_stream and "content-length" not in named
        return frames.continue_response(sorted(remove), hear_end=hear_end, set_headers=self.cors)

    def _served_by(self, served: str | None) -> None:
        """A fallback served the request (the pick was unreachable): the lease moves to it, and
        the pick's slot is freed (its request never reached it)."""
        assert self.lease is not None
        if served is None or served == _endpoint_of(self.lease.replica) or served not in self.fallbacks:
            return
        replica = next((r for r in self.router.table.replicas() if _endpoint_of(r) == served), None)
        if replica is None:
            return
        old, table = self.lease, self.router.table
        started = RequestStarted.to(replica, old.model)
        table.apply(started, self.router.clock())
        self.lease = Lease(started, old.kind, table, self.router.clock)
        old.release(False)

    def _rewrite(self, chunk: ext.HttpBody) -> ext.ProcessingResponse:
        """Gather an error answer's body; at its end, send it on as the protocol's error."""
        assert self.rewriting is not None
        self.rewriting += chunk.body
        if not chunk.end_of_stream:
            return frames.replaced(b"", end=False, streamed=self.echo)
        self.finish()
        message, _ = oip.replica_error(bytes(self.rewriting), None)
        return frames.replaced(error_body(message), end=True, streamed=self.echo)

    def finish(self) -> None:
        """The request is over: free the replica's slot and count it (once)."""
        if self.lease is not None:
            self.lease.release(0 < self.status < 400)
            self.lease = None
        if self.counted:
            self.counted = False
            metrics = self.router.metrics
            metrics.inflight.dec()
            metrics.observe(self.status or 499, time.perf_counter() - self.started, self.model, protocol="gateway")


def _endpoint_of(replica: Replica) -> str:
    """A replica's ``ip:port``, as the Gateway reaches it."""
    return _endpoint_of_url(replica.url)


@functools.lru_cache(maxsize=4096)  # a few per decision, over a pool's few URLs: parsed once each
def _endpoint_of_url(replica_url: str) -> str:
    url = urlsplit(replica_url)
    return endpoint(url.hostname or "", url.port or 80)


def _ranked_after(router: Router, model: str, first: Replica, exclude: set[str], count: int) -> list[Replica]:
    """Up to ``count`` replicas after ``first`` for ``model``, in the order the router's policy
    chooses them (each choice made as if the ones before it were gone), none of ``exclude``; no
    slot is taken on them (only the pick holds one)."""
    scheduler = router.scheduler
    choose = POLICIES[scheduler.policy_name]
    now = scheduler.clock()
    gone = {*exclude, first.name}
    ranked: list[Replica] = []
    while len(ranked) < count:
        pool = scheduler.table.pool(now, gone)
        decision = choose(pool, model, scheduler.params, rng=scheduler.rng) if pool else None
        if decision is None:  # every other replica is full now: a fallback there would only wait
            break
        ranked.append(decision.replica)
        gone.add(decision.replica.name)
    return ranked


def _served(message: ext.ProcessingRequest) -> str | None:
    """The endpoint that served the request, where the Gateway says (``envoy.lb`` metadata's
    ``x-gateway-destination-endpoint-served``, else the ``upstream.address`` attribute)."""
    lb = message.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if lb is not None and SERVED_KEY in lb.fields:
        return lb.fields[SERVED_KEY].string_value or None
    for attributes in message.attributes.values():
        if UPSTREAM_ATTRIBUTE in attributes.fields:
            return attributes.fields[UPSTREAM_ATTRIBUTE].string_value or None
    return None


def _subset(message: ext.ProcessingRequest) -> frozenset[str]:
    """The Gateway's subset hint (``envoy.lb.subset_hint``), empty when it sent none."""
    hint = message.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return frozenset()
    value = hint.fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    return frozenset(part.strip() for part in value.string_value.split(",") if part.strip())


def _source(message: ext.ProcessingRequest) -> str | None:
    """The client's address, where the Gateway sends it (``request_attributes: [source.address]``)."""
    for attributes in message.attributes.values():
        if "source.address" in attributes.fields:
            return attributes.fields["source.address"].string_value.rsplit(":", 1)[0] or None
    return None


def _bearer(named: dict[str, str], method: str, raw_path: str) -> str | None:
    """The request's bearer token, as the HTTP front reads it (header, or ``access_token`` on a GET)."""
    scheme, _, token = named.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if method == "GET":
        sent = parse_qs(raw_path.partition("?")[2]).get(ACCESS_TOKEN_PARAM)
        return sent[0] if sent else None
    return None


def _consumed(router: Router) -> bool:
    """Whether the picker consumed the client's credential (auth on, ``forwardCredentials`` off):
    then it does not reach the replica."""
    return router.access.auth_on and not router.config.forward_credentials
