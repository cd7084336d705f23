"""The application: `create_app(settings, engine=None)` builds the FastAPI app.

The lifespan owns the engine: with no engine given it starts the one vLLM engine of the
process from the settings and shuts it down on exit; tests may pass a ready engine (real
or fake), which the app then uses but does not stop. Either way the native gRPC server
(`app.routes.grpc.server`) runs on that engine while the app does, unless --grpc-port is 0.

Each app has one `Admission` (`app.state.admission`: the queue bound every protocol asks
before any prompt work), one `Drain` over it (`app.state.drain`: what SIGTERM starts,
see `app.cli`) and one `Telemetry` (`app.state.telemetry`: each request's record, span,
access-log line and metrics; `app.telemetry`), whose tracer the lifespan flushes and
stops on its way out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app.admission import Admission
from app.auth import Keyring
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.metrics import install_metrics
from app.routes.apis import (
    anthropic,
    compaction,
    conversations,
    graphpipe,
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
from app.routes.ws import evergreen, salience
from app.routes.ws import responses as responses_ws
from app.telemetry.http import HttpTelemetry
from app.telemetry.reports import Telemetry


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            app.state.engine = engine
            async with _telemetry_stopped(telemetry), _runners_closed(app), serve_grpc(app):
                yield
            return
        from app.engine.vllm.startup import start_engine

        started = await start_engine(settings)
        app.state.engine = started
        try:
            async with _telemetry_stopped(telemetry), _runners_closed(app), serve_grpc(app):
                yield
        finally:
            started.shutdown()

    app = FastAPI(title="Switchboard", lifespan=lifespan, default_response_class=OrjsonResponse)
    app.state.settings = settings
    app.state.keyring = Keyring.from_settings(settings)
    app.state.admission = Admission(
        settings.max_queued_requests or None, settings.max_queued_tokens or None
    )
    app.state.drain = Drain(app.state.admission, settings.drain_timeout_s, settings.drain_grace_s)
    telemetry = app.state.telemetry = Telemetry(settings)
    if engine is not None:
        app.state.engine = engine
    install_error_handlers(app, default=openai.openai_error)
    for module in (
        probes,
        openai,
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
        app.include_router(module.router)
    install_metrics(app, app.state.admission, telemetry.metrics)
    # Outermost: it sees every answer, the error handlers' and the metrics' included.
    app.add_middleware(HttpTelemetry, telemetry=telemetry)
    _document_bodies(app)
    return app


@asynccontextmanager
async def _telemetry_stopped(telemetry: Telemetry) -> AsyncIterator[None]:
    """On the way out, once every request has ended, the spans left are exported."""
    try:
        yield
    finally:
        telemetry.shutdown()


@asynccontextmanager
async def _runners_closed(app: FastAPI) -> AsyncIterator[None]:
    """On the way out, once the gRPC server has ended its calls, the Responses API's
    background runs end, and its store, the conversations' and the Salience sessions'
    close (before the engine stops), if anything used them."""
    try:
        yield
    finally:
        for name in ("responses", "conversations", "salience"):
            runner = getattr(app.state, name, None)
            if runner is not None:
                await runner.close()


def _document_bodies(app: FastAPI) -> None:
    """/openapi.json with the hand-parsed request bodies declared (`routes.bodies`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = collect_definitions(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
