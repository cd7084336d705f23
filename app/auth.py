"""The shared API key check, for every transport (HTTP, websockets, gRPC).

`--api-key` is one shared secret. Each transport reads what the client offered (an
`Authorization: Bearer <key>` header, gRPC's `authorization` metadata, a websocket's
`?token=`) and hands it here; the comparison runs in constant time.
"""

from __future__ import annotations

import hmac

from app.errors import Unauthenticated


def bearer_token(authorization: str) -> str | None:
    """The key of an `Authorization` value `Bearer <key>` (scheme case-insensitive)."""
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def check_key(expected: str | None, offered: str | None) -> None:
    """Raise `Unauthenticated` unless no key is configured or `offered` is it."""
    if expected is None:
        return
    if offered is None or not hmac.compare_digest(offered.encode(), expected.encode()):
        raise Unauthenticated("Missing or invalid API key", code="invalid_api_key")
