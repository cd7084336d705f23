"""The application: `create_app(settings, engine=None, tracing=None)` builds the FastAPI app.

Its objects (`app.objects.AppObjects` on `app.state.objects`: the keyring, the one
`Admission` every protocol asks before any prompt work, the `Drain` over it that SIGTERM
starts (`app.cli`), the telemetry, and on the engine the stores and the APIs over them)
are made here. With no engine given, the lifespan starts the one vLLM engine of the
process from the settings and builds on it; an app given a ready engine (real or fake:
`switchboard serve`, tests) builds on it at once, and the engine is the giver's to stop.
Either way the native gRPC server (`app.routes.grpc.server`) runs on those objects while
the lifespan does, unless --grpc-port is 0, and ends before the lifespan closes them.
The settings, keyring, admission, drain and telemetry are on `app.state` too, by those
names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from app.config import Settings
from app.engine.base import Engine
from app.metrics import install_metrics
from app.objects import AppObjects
from app.routes.apis import (
    anthropic,
    batches,
    compaction,
    conversations,
    files,
    graphpipe,
    message_batches,
    openai,
    playground,
    probes,
    responses,
    tokens,
)
from app.routes.grpc.server import serve_grpc
from app.routes.http.bodies import collect_definitions
from app.routes.http.errors import install_error_handlers
from app.routes.http.json import OrjsonResponse
from app.routes.http.origins import install_origins
from app.routes.raw_send import keep_raw_send
from app.routes.ws import evergreen, salience
from app.routes.ws import responses as responses_ws
from app.telemetry.http import HttpTelemetry
from app.telemetry.tracing import Tracing


def create_app(
    settings: Settings, engine: Engine | None = None, tracing: Tracing | None = None
) -> FastAPI:
    """`tracing`: the tracer `engine` was started with (`start_engine`'s), the app's own."""
    objects = AppObjects(settings, tracing)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is None:
            await objects.start_engine()
        objects.batches.start()  # batches of before a restart resume
        try:
            async with serve_grpc(objects):
                yield
        finally:
            await objects.close()

    app = _App(title="Switchboard", lifespan=lifespan, default_response_class=OrjsonResponse)
    app.state.objects = objects
    app.state.settings = settings
    app.state.keyring = objects.keyring
    app.state.admission = objects.admission
    app.state.drain = objects.drain
    app.state.telemetry = telemetry = objects.telemetry
    if engine is not None:
        objects.build_on(engine)
    install_error_handlers(app, default=openai.openai_error)
    app.router.routes.extend(_routes())
    install_metrics(
        app,
        objects.admission,
        telemetry.metrics,
        lambda: objects.salience,
        lambda: objects.batches,
    )
    install_origins(
        app, settings.allowed_origins, settings.allowed_methods, settings.allowed_headers
    )
    # Outermost: it sees every answer, the error handlers', the metrics' and the origin
    # guard's included.
    app.add_middleware(HttpTelemetry, telemetry=telemetry)
    _document_bodies(app)
    return app


@cache
def _routes() -> tuple[BaseRoute, ...]:
    """Every API's routes, as `app.include_router` adds them, built once in a process and
    shared by its apps. Building a route reads its endpoint's signature and builds pydantic
    validators for its parameters (0.1 s for the ~60 routes: nearly all of `create_app`,
    which the unit tests call some 500 times); a route holds nothing of an app (a handler
    finds its app in the request's scope, and no app overrides dependencies)."""
    router = APIRouter(default_response_class=OrjsonResponse)
    for module in (
        probes,
        openai,
        files,
        batches,
        message_batches,  # before anthropic's /v1/messages/{rest}
        anthropic,
        compaction,
        conversations,
        responses,
        responses_ws,
        graphpipe,
        tokens,
        salience,
        evergreen,
        playground,
    ):
        router.include_router(module.router)
    return tuple(router.routes)


class _App(FastAPI):
    """The app, keeping the server's own `send` in each scope for what streams past the
    middleware stack (`app.routes.raw_send`): wired here, so that every server of this
    app (uvicorn, a test's ASGI client) runs what `switchboard serve` runs."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keep_raw_send(scope, send)
        await super().__call__(scope, receive, send)


def _document_bodies(app: FastAPI) -> None:
    """/openapi.json with the hand-parsed request bodies declared (`routes.bodies`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = collect_definitions(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
