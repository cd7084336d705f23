"""Callers for tests that drive the session layer directly, as a transport would after
deciding who the caller is (`app.auth`)."""

from __future__ import annotations

from typing import Any

from app.tenants import DEFAULT_TENANT, Limits, Principal, Role


def caller(tenant: str = DEFAULT_TENANT, **limits: Any) -> Principal:
    """A data-plane caller of `tenant`, under `limits` (unset: no quota of its own, the
    server's bounds)."""
    role = Role.FULL if tenant == DEFAULT_TENANT else Role.TENANT
    return Principal(tenant, role, Limits(**limits), tenant)


ANYONE = caller()  # the caller of a server with no key, as before tenants
