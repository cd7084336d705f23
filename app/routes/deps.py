"""Typed dependencies shared by the route modules: the engine, the settings, the
admission bound, auth.

They live on `app.state` (set by `app.main.create_app`); routes take them through
`EngineDep` / `SettingsDep` / `AdmissionDep` (or the `get_*` functions on a websocket)
and never reach for a global.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from app.admission import Admission
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.errors import Unauthenticated


def get_engine(conn: HTTPConnection) -> Engine:
    engine: Engine = conn.app.state.engine
    return engine


def get_settings(conn: HTTPConnection) -> Settings:
    settings: Settings = conn.app.state.settings
    return settings


def get_admission(conn: HTTPConnection) -> Admission:
    admission: Admission = conn.app.state.admission
    return admission


def get_drain(conn: HTTPConnection) -> Drain:
    drain: Drain = conn.app.state.drain
    return drain


# Dependencies are `async def` on purpose: FastAPI runs a plain `def` dependency in its
# thread pool, a thread hop on every request.
async def _engine_dependency(conn: HTTPConnection) -> Engine:
    return get_engine(conn)


async def _settings_dependency(conn: HTTPConnection) -> Settings:
    return get_settings(conn)


async def _admission_dependency(conn: HTTPConnection) -> Admission:
    return get_admission(conn)


async def _drain_dependency(conn: HTTPConnection) -> Drain:
    return get_drain(conn)


EngineDep = Annotated[Engine, Depends(_engine_dependency)]
AdmissionDep = Annotated[Admission, Depends(_admission_dependency)]
DrainDep = Annotated[Drain, Depends(_drain_dependency)]
SettingsDep = Annotated[Settings, Depends(_settings_dependency)]


def check_credentials(conn: HTTPConnection) -> None:
    """Raise `Unauthenticated` unless the connection carries the configured key, as
    `Authorization: Bearer <key>` or (for browsers' websockets) a `token` query parameter."""
    expected = get_settings(conn).api_key
    if expected is None:
        return
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    offered = value.strip() if scheme.lower() == "bearer" else conn.query_params.get("token")
    if offered is None or not hmac.compare_digest(offered.encode(), expected.encode()):
        raise Unauthenticated("Missing or invalid API key", code="invalid_api_key")


async def require_api_key(request: Request) -> None:
    """HTTP dependency form of `check_credentials`."""
    check_credentials(request)


AuthDep = Depends(require_api_key)
