"""The application: `create_app(settings, engine=None)` builds the FastAPI app.

The lifespan owns the engine: with no engine given it starts the one vLLM engine of the
process from the settings and shuts it down on exit; tests may pass a ready engine (real
or fake), which the app then uses but does not stop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from app.config import Settings
from app.engine.base import Engine
from app.errors import SwitchboardError
from app.metrics import install_metrics
from app.routes import evergreen, graphpipe, openai, playground, salience
from app.routes.bodies import describe_errors
from app.routes.responses import OrjsonResponse


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SwitchboardError)
    async def _switchboard_error(request: Request, exc: SwitchboardError) -> Response:
        return OrjsonResponse(exc.openai_body(), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return OrjsonResponse(describe_errors(exc.errors()).openai_body(), status_code=400)


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            app.state.engine = engine
            yield
            return
        from app.engine.vllm import VllmEngine

        started = await VllmEngine.start(settings)
        app.state.engine = started
        try:
            yield
        finally:
            started.shutdown()

    app = FastAPI(title="Switchboard", lifespan=lifespan, default_response_class=OrjsonResponse)
    app.state.settings = settings
    if engine is not None:
        app.state.engine = engine
    _install_error_handlers(app)
    for module in (openai, graphpipe, salience, evergreen):
        app.include_router(module.router)
    app.include_router(playground.router)
    install_metrics(app)
    return app
