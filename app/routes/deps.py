"""Typed dependencies shared by the route modules: the app's objects, the settings, and
the caller (`Principal`, decided once where the request enters).

Nothing is built here: `app.objects.AppObjects` makes the keyring, admission, drain,
telemetry, the engine's stores and the APIs over them (`app.state.objects`, made by
`app.main.create_app`); this module only hands them out. HTTP routes take them through
`EngineDep` / `SettingsDep` / `AdmissionDep` / `DrainDep` / `ResponsesDep` /
`ConversationsDep` / `PrincipalDep`, websockets through the `get_*` functions, and never
reach for a global. The settings are read from `app.state.settings`, per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from app.admission import Admission
from app.auth import Keyring, bearer_token, controlling, serving
from app.batches.service import Batches
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.objects import AppObjects
from app.sessions.conversations import Conversations
from app.sessions.responses import Responses
from app.tenants import Principal


def get_objects(app: Starlette) -> AppObjects:
    """The app's objects (`app.objects`), made by `create_app`."""
    objects: AppObjects = app.state.objects
    return objects


def get_engine(conn: HTTPConnection) -> Engine:
    return get_objects(conn.app).engine


def get_settings(conn: HTTPConnection) -> Settings:
    settings: Settings = conn.app.state.settings
    return settings


def get_admission(conn: HTTPConnection) -> Admission:
    return get_objects(conn.app).admission


def get_drain(conn: HTTPConnection) -> Drain:
    return get_objects(conn.app).drain


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


async def _responses_dependency(conn: HTTPConnection) -> Responses:
    return get_objects(conn.app).responses


async def _conversations_dependency(conn: HTTPConnection) -> Conversations:
    return get_objects(conn.app).conversations


ResponsesDep = Annotated[Responses, Depends(_responses_dependency)]


async def _batches_dependency(conn: HTTPConnection) -> Batches:
    return get_objects(conn.app).batches


BatchesDep = Annotated[Batches, Depends(_batches_dependency)]
ConversationsDep = Annotated[Conversations, Depends(_conversations_dependency)]


def get_keyring(conn: HTTPConnection) -> Keyring:
    return get_objects(conn.app).keyring


def authenticated(conn: HTTPConnection, offered: str | None) -> Principal:
    """The principal of the key `offered` on `conn` (`Unauthenticated` if none), kept
    on the connection's state for what runs around the route (metrics, the access log):
    decided here, once, where the request enters."""
    principal = get_keyring(conn).authenticate(offered)
    conn.state.principal = principal
    return principal


def principal_on(conn: HTTPConnection) -> Principal:
    """The principal its route's key check decided for `conn` (a route with none is a
    bug: every data-plane route is guarded)."""
    principal: Principal = conn.state.principal
    return principal


def principal_of(conn: HTTPConnection) -> Principal:
    """The data plane's caller on `conn`, from `Authorization: Bearer <key>` or (for
    browsers' websockets) a `token` query parameter: `Unauthenticated` without a
    configured key, `PermissionDenied` for the control plane's."""
    offered = bearer_token(conn.headers.get("authorization", ""))
    if offered is None:
        offered = conn.query_params.get("token")
    return serving(authenticated(conn, offered))


async def require_principal(request: Request) -> Principal:
    """HTTP dependency form of `principal_of`."""
    return principal_of(request)


PrincipalDep = Annotated[Principal, Depends(require_principal)]
AuthDep = Depends(require_principal)  # a router's `dependencies`: the same, resolved once


async def require_x_api_principal(request: Request) -> Principal:
    """The key as Anthropic's clients send it: `x-api-key` (the anthropic SDK's and
    Claude Code's `ANTHROPIC_API_KEY`), or `Authorization: Bearer` (`ANTHROPIC_AUTH_TOKEN`,
    and the SDK's `api_key` in its latest releases). Only for the Anthropic routes: the
    other APIs' clients never send `x-api-key`."""
    offered = request.headers.get("x-api-key")
    if offered is None:
        offered = bearer_token(request.headers.get("authorization", ""))
    return serving(authenticated(request, offered))


XApiKeyPrincipalDep = Annotated[Principal, Depends(require_x_api_principal)]
XApiKeyAuthDep = Depends(require_x_api_principal)


async def require_control_plane(request: Request) -> Principal:
    """The caller of a route that changes the server: a control-plane (or full) key."""
    offered = bearer_token(request.headers.get("authorization", ""))
    return controlling(authenticated(request, offered))


ControlPlaneDep = Depends(require_control_plane)
