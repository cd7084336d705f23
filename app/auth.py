"""Keys -> principals, for every transport (HTTP, websockets, gRPC).

Each transport reads what the client offered (an `Authorization: Bearer <key>` header,
Anthropic's `x-api-key`, gRPC's `authorization` metadata, a websocket's `?token=`) and
hands it to `Keyring.authenticate`, once, where the request enters; the `Principal` it
returns (`app.tenants`) travels with the request from there.

- No key configured: every caller is the default tenant with full rights, as before
  tenants existed.
- Otherwise a key is needed everywhere but the open routes (probes, /version, /metrics,
  the playground's files; gRPC health and reflection): `--api-key` is the default
  tenant's with full rights, each `--tenant-api-key TENANT_ID:KEY` its tenant's data
  plane, each `--control-plane-api-keys` key the control plane's. A key missing or not
  one of these gets one answer, whichever it was (`Unauthenticated`, "Missing or invalid
  API key"): the answer tells nothing of which keys exist.

Comparisons take the same time whatever the key offered: the offered key's SHA-256 is
compared with every configured key's, each in constant time, with no early exit.

Behind SMG (`--tenant-api-key` there too): SMG forwards the caller's own
`Authorization` header to the replica, and nothing else that names the tenant, so a
replica given the same `--tenant-api-key` entries decides the tenant itself, from the
key, as for a direct client; nothing forwarded needs trusting.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import replace

from app.config import Settings
from app.errors import ConfigError, PermissionDenied, Unauthenticated
from app.tenants import (
    DEFAULT_TENANT,
    EVERY_TENANT,
    Limits,
    Principal,
    Role,
    Tenants,
    parse_limits,
    share,
)

INVALID_KEY = "Missing or invalid API key"


def bearer_token(authorization: str) -> str | None:
    """The key of an `Authorization` value `Bearer <key>` (scheme case-insensitive)."""
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class Keyring:
    """The configured keys, each with the principal it makes."""

    def __init__(self, tenants: Tenants, keys: Sequence[tuple[str, Principal]]) -> None:
        self.tenants = tenants
        self._keys = [(_digest(key), principal) for key, principal in keys]
        self._keyless = tenants.principal(DEFAULT_TENANT, Role.FULL)

    @classmethod
    def from_settings(cls, settings: Settings) -> Keyring:
        tenant_keys = [entry.partition(":")[::2] for entry in settings.tenant_api_key]
        configured = {tenant for tenant, _ in tenant_keys}
        if settings.api_key is not None or not (tenant_keys or settings.control_plane_api_keys):
            configured.add(DEFAULT_TENANT)
        count = len(configured)
        defaults = Limits(
            concurrent=share(settings.max_queued_requests, count) if count > 1 else 0,
            sessions=share(settings.salience_max_sessions, count),
            session_tokens=share(settings.salience_max_total_tokens, count),
            stored_bytes=share(settings.responses_store_max_bytes, count),
            uploaded_bytes=share(settings.batch_store_max_bytes, count),
        )
        overrides: dict[str, dict[str, int]] = {}
        for entry in settings.tenant_limits:
            tenant, values = parse_limits(entry)
            overrides.setdefault(tenant, {}).update(values)
        every = overrides.pop(EVERY_TENANT, {})
        tenants = Tenants(configured, replace(defaults, **every), overrides)
        keys: list[tuple[str, Principal]] = []
        if settings.api_key is not None:
            keys.append((settings.api_key, tenants.principal(DEFAULT_TENANT, Role.FULL)))
        keys += [(key, tenants.principal(tenant, Role.TENANT)) for tenant, key in tenant_keys]
        control = tenants.principal(DEFAULT_TENANT, Role.CONTROL_PLANE)
        keys += [(key, control) for key in settings.control_plane_api_keys]
        if len({key for key, _ in keys}) < len(keys):
            raise ConfigError("the same API key is configured twice")
        return cls(tenants, keys)

    @property
    def keyless(self) -> bool:
        """No key is configured: every caller is the default tenant, with full rights."""
        return not self._keys

    def authenticate(self, offered: str | None) -> Principal:
        """The principal of the key `offered`; `Unauthenticated` if it is none of the
        configured keys (or missing while any is configured)."""
        if not self._keys:
            return self._keyless
        digest = _digest(offered or "")
        found: Principal | None = None
        for key, principal in self._keys:  # every key, no early exit
            if hmac.compare_digest(digest, key) and offered is not None:
                found = principal
        if found is None:
            raise Unauthenticated(INVALID_KEY, code="invalid_api_key")
        return found


def serving(principal: Principal) -> Principal:
    """`principal`, if it may use the data plane."""
    if not principal.serves:
        raise PermissionDenied(
            "This key belongs to the control plane, which serves no requests: use a tenant's key"
        )
    return principal


def controlling(principal: Principal) -> Principal:
    """`principal`, if it may change the server."""
    if not principal.controls:
        raise PermissionDenied("Only a control-plane key may change the server")
    return principal


def reading_every_tenant(principal: Principal) -> Principal:
    """`principal`, if it may read what every tenant's requests leave behind (the
    engine's KV-cache events carry their prompts' token ids): a full key (`--api-key`),
    or any caller when no key is configured."""
    if principal.role is not Role.FULL:
        raise PermissionDenied(
            "The KV-cache events carry every tenant's tokens: only a full key reads them"
        )
    return principal
