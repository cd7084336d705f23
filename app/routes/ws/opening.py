"""What every websocket session checks as it opens, and how a refused one closes: the
websocket's side of a session's opening (`app.sessions.lifetime`).

- `caller(websocket)`: the principal of the key it carries (`Authorization: Bearer`, or
  `?token=` from a browser, `app.routes.deps.principal_of`), the one check every
  websocket of every protocol passes before its session exists: a check only a
  websocket has (its Origin, its frames' size) goes here.
- `refusal_close_code(error)`: the close code after a refusal's frame, where the
  protocol has none of its own (Evergreen has: `app.protocols.evergreen.lifecycle`):
  1001 (going away: come back, the server is draining or overloaded) for an
  UNAVAILABLE refusal, 1008 (policy violation) for any other.
"""

from __future__ import annotations

from fastapi import WebSocket

from app.errors import SwitchboardError
from app.routes.deps import principal_of
from app.tenants import Principal

GOING_AWAY = 1001
POLICY_VIOLATION = 1008


def caller(websocket: WebSocket) -> Principal:
    """The principal `websocket` opens its session as; the refusal raised."""
    return principal_of(websocket)


def refusal_close_code(error: SwitchboardError) -> int:
    return GOING_AWAY if error.http_status == 503 else POLICY_VIOLATION
