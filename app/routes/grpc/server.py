"""The native gRPC transport: one grpcio asyncio server in the app's process, on its engine.

The app's lifespan runs it (`serve_grpc`) on `--host` and `--grpc-port` (0 turns it off),
once the engine is up, and stops it before the engine. It serves:

- the protocol services, each a thin adapter in its own module (`salience`,
  `evergreen`, and `vllm_engine`: SMG's gRPC workers' protocol), registered through
  `SERVICES`;
- `grpc.health.v1.Health`: the overall status ("") and each service's are SERVING while
  `engine.check_health()` passes and the server is not draining, NOT_SERVING otherwise
  (a drain turns them at once: SMG, which probes the service by name, and a Kubernetes
  gRPC readiness probe stop sending to a replica that is going away); `Check` asks the
  engine on every call, `Watch` sees the status polled every few seconds; all turn
  NOT_SERVING as the server stops;
- server reflection (`grpc.reflection.v1alpha`, what grpcurl and grpcui ask), listing the
  services above, health and reflection.

Keys (`app.auth`): with any configured, every service but health and reflection needs
`authorization: Bearer <key>` metadata, or the call ends UNAUTHENTICATED before its
handler runs (PERMISSION_DENIED for a control-plane key: no service here changes the
server). The interceptor decides each call's principal there, once, and the handler
runs with it (`calls.principal()`). Health and reflection stay open, as `/health` and
`/openapi.json` do over HTTP (a Kubernetes gRPC probe sends no metadata).

Messages are bounded by `--grpc-max-message-bytes` both ways (RESOURCE_EXHAUSTED beyond).
The port is bound without SO_REUSEPORT (grpcio's default would share a port in use with
another process without a word): a taken port stops the start as a `ConfigError`. On
stop, calls in flight get `STOP_GRACE_S`, then are cancelled, which aborts their engine
requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from app.auth import Keyring, bearer_token, serving
from app.drain import Drain
from app.engine.base import Engine
from app.errors import ConfigError, SwitchboardError
from app.objects import AppObjects
from app.routes.grpc import evergreen, salience, vllm_engine
from app.routes.grpc.calls import Context, Service, abort, shaped_like, with_principal

logger = logging.getLogger(__name__)

STOP_GRACE_S = 2.0
HEALTH_POLL_S = 5.0
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only


# The protocol services, each from its adapter module.
SERVICES: tuple[Service, ...] = (salience.SERVICE, evergreen.SERVICE, vllm_engine.SERVICE)


# -- auth -----------------------------------------------------------------------------


class _Principals(grpc.aio.ServerInterceptor):
    """Decides each call's principal from its `authorization` metadata, once, before its
    handler runs (`app.auth`): every service but health and reflection, so that a service
    added later is guarded without a word. A call without a good key, or with the
    control plane's, ends before its handler runs; any other runs with its principal
    (`calls.principal()`)."""

    def __init__(self, keyring: Keyring, open_services: Sequence[str]) -> None:
        self._keyring = keyring
        self._open = tuple(f"/{name}/" for name in open_services)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(self._open):
            return handler
        offered = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization" and isinstance(value, str):
                offered = bearer_token(value)
        try:
            principal = serving(self._keyring.authenticate(offered))
        except SwitchboardError as exc:
            return _refusal(handler, exc)
        return with_principal(handler, principal)


def _refusal(handler: _Handler, exc: SwitchboardError) -> _Handler:
    """A handler of the same shape as `handler` that ends the call with `exc`."""

    async def refuse(_: object, context: Context) -> None:
        await abort(context, exc)

    return shaped_like(handler, refuse)


# -- health ---------------------------------------------------------------------------


class _Health(health_aio.HealthServicer):
    """grpc.health.v1 over `engine.check_health()` and the drain."""

    def __init__(self, engine: Engine, drain: Drain, services: Sequence[str]) -> None:
        super().__init__()
        self._engine = engine
        self._drain = drain
        self._services = ("", *services)

    async def refresh(self) -> None:
        status: int = health_pb2.HealthCheckResponse.NOT_SERVING
        if not self._drain.draining:
            try:
                await self._engine.check_health()
                status = health_pb2.HealthCheckResponse.SERVING
            except Exception:
                logger.warning("engine health check failed", exc_info=True)
        for service in self._services:
            await self.set(service, status)

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: Context,
    ) -> health_pb2.HealthCheckResponse:
        await self.refresh()
        return await super().Check(request, context)

    async def poll(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(HEALTH_POLL_S)


# -- the server -----------------------------------------------------------------------


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@asynccontextmanager
async def serve_grpc(objects: AppObjects) -> AsyncIterator[grpc.aio.Server | None]:
    """Run the gRPC server on the app's objects (its settings, keyring, engine and drain,
    its services' runners) while inside; None when `--grpc-port` is 0."""
    settings = objects.settings
    if not settings.grpc_port:
        yield None
        return
    engine = objects.engine
    names = [service.name for service in SERVICES]
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    interceptors = [_Principals(objects.keyring, [health_name, reflection.SERVICE_NAME])]
    limit = settings.grpc_max_message_bytes
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ],
    )
    for service in SERVICES:
        service.add(server, objects)
    health = _Health(engine, objects.drain, names)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    refreshes: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    def refresh() -> None:
        task = loop.create_task(health.refresh())
        refreshes.add(task)
        task.add_done_callback(refreshes.discard)

    def drained() -> None:  # Watch streams see NOT_SERVING now, not at the next poll
        loop.call_soon_threadsafe(refresh)

    objects.drain.on_begin(drained)
    reflection.enable_server_reflection([*names, health_name, reflection.SERVICE_NAME], server)
    address = _address(settings.host, settings.grpc_port)
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen for gRPC on {address}: {exc}") from exc
    await server.start()
    poller = asyncio.create_task(health.poll())
    logger.info("gRPC on %s", address)
    try:
        yield server
    finally:
        await health.enter_graceful_shutdown()
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await server.stop(STOP_GRACE_S)
