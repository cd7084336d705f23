"""Typed dependencies shared by the route modules: the engine, the settings, the
admission bound, and the caller (`Principal`, decided once where the request enters).

They live on `app.state` (set by `app.main.create_app`); routes take them through
`EngineDep` / `SettingsDep` / `AdmissionDep` (or the `get_*` functions on a websocket)
and never reach for a global.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from app.admission import Admission
from app.auth import Keyring, bearer_token, controlling, serving
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.sessions.conversations import Conversations
from app.sessions.named import NamedRequests
from app.sessions.responses import Responses
from app.sessions.salience import SalienceRunner
from app.store import open_conversations, open_store
from app.tenants import Principal


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


def salience_runner(app: Starlette) -> SalienceRunner:
    """The process's Salience service on the engine, made on first use. One for every
    connection of every transport (websocket, gRPC): sessions outlive connections."""
    state = app.state
    runner: SalienceRunner | None = getattr(state, "salience", None)
    if runner is None:
        runner = state.salience = SalienceRunner.from_settings(
            state.engine, state.admission, state.drain, state.settings
        )
    return runner


def named_requests(app: Starlette) -> NamedRequests:
    """The process's requests named by their clients (SMG's and llm-d's aborts), made on
    first use; one for every transport that takes names."""
    state = app.state
    named: NamedRequests | None = getattr(state, "named_requests", None)
    if named is None:
        named = state.named_requests = NamedRequests(state.engine)
    return named


def responses_api(app: Starlette) -> Responses:
    """The process's Responses API and its store, made on first use (nothing is opened or
    connected before): one for every connection of every transport, since background runs
    and the store outlive them."""
    state = app.state
    responses: Responses | None = getattr(state, "responses", None)
    if responses is None:
        settings: Settings = state.settings
        store = open_store(
            settings.responses_store_location(),
            ttl_s=settings.responses_store_ttl_s,
            max_bytes=settings.responses_store_max_bytes,
        )
        responses = state.responses = Responses(
            state.engine, state.admission, store, state.drain, conversations(app), state.telemetry
        )
    return responses


def conversations(app: Starlette) -> Conversations:
    """The process's Conversations API and its store (beside the stored responses, at
    `--responses-store`), made on first use."""
    state = app.state
    made: Conversations | None = getattr(state, "conversations", None)
    if made is None:
        settings: Settings = state.settings
        store = open_conversations(
            settings.responses_store_location(),
            ttl_s=settings.responses_store_ttl_s,
            max_bytes=settings.responses_store_max_bytes,
        )
        made = state.conversations = Conversations(store)
    return made


async def _conversations_dependency(conn: HTTPConnection) -> Conversations:
    return conversations(conn.app)


ConversationsDep = Annotated[Conversations, Depends(_conversations_dependency)]


async def _responses_dependency(conn: HTTPConnection) -> Responses:
    return responses_api(conn.app)


ResponsesDep = Annotated[Responses, Depends(_responses_dependency)]


def get_keyring(conn: HTTPConnection) -> Keyring:
    keyring: Keyring = conn.app.state.keyring
    return keyring


def authenticated(conn: HTTPConnection, offered: str | None) -> Principal:
    """The principal of the key `offered` on `conn` (`Unauthenticated` if none), kept
    on the connection's state for what runs around the route (metrics, the access log):
    decided here, once, where the request enters."""
    principal = get_keyring(conn).authenticate(offered)
    conn.state.principal = principal
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
