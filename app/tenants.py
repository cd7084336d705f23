"""Tenants and roles: who a request is, decided once where it enters (`app.auth`), and
what that allows it.

A `Principal` is the caller of one request, call or connection: its tenant, its role and
its tenant's `Limits`. Every transport decides it once, at its edge (an HTTP dependency,
a websocket's upgrade, the gRPC server's interceptor), and hands it on with the request,
as it does the request's deadline: routes pass it to the session layer, which looks
every stored thing up by (tenant, id) and counts each tenant's quotas.

Roles:

    TENANT         the data plane, as its tenant (an `--tenant-api-key TENANT_ID:KEY`)
    CONTROL_PLANE  the routes that change the server (LoRA load and unload), nothing else
                   (a `--control-plane-api-keys` key)
    FULL           both, as the default tenant (`--api-key`; and every request when no
                   key is configured, as before tenants existed); the only role that
                   reads what every tenant leaves in the engine (SMG's KV-cache events,
                   their prompts' token ids: `app.auth.reading_every_tenant`)

What a tenant stores is its own: another tenant's id is NOT_FOUND, never FORBIDDEN (no
oracle on which ids exist). A role's refusal is FORBIDDEN: the key is good, the route
is not its.

Limits (`--tenant-limits TENANT_ID:name=value,...`; `*` for every tenant's default):

    priority        the most urgent priority its requests may ask (vLLM runs smaller
                    first): a request asking for less is raised to it, in admission
                    (`app.admission.clamp_priority`, the one rule). Default 0, the
                    default priority: a client may only make its work less urgent
    concurrent      its units of engine work admitted at once (queued or running);
                    0: no bound of its own. Default: with one tenant none; with several,
                    an equal share of the queue bound (`--max-queued-requests`)
    sessions        Salience sessions it holds (its own least recently used idle one is
                    evicted to open one more); default: an equal share of
                    `--salience-max-sessions`
    session_tokens  the tokens its Salience sessions hold; default: an equal share of
                    `--salience-max-total-tokens`
    stored_bytes    the bytes of its stored responses, and apart the bytes of its
                    conversations (its own oldest are evicted to fit a write); default:
                    an equal share of `--responses-store-max-bytes`
    uploaded_bytes  the bytes of its uploaded files in the batch store (an upload past
                    it is refused; nothing is evicted); default: an equal share of
                    `--batch-store-max-bytes`

"Configured tenants" are those a key names (the default tenant's when `--api-key` is set
or no key at all is); an equal share is the global bound over their number, so with one
tenant its limits are the server's own, as before tenants existed. A tenant no key
names any more (a batch stored before its key was removed) gets the default limits, and
/metrics folds it into the label `other` (`Tenants.label`), so the labels stay bounded.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

DEFAULT_TENANT = "default"
OTHER_TENANTS = "other"  # the /metrics label of every tenant no key names
EVERY_TENANT = "*"  # `--tenant-limits *:...`: every tenant's defaults


class Role(enum.Enum):
    TENANT = "tenant"
    CONTROL_PLANE = "control_plane"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's quotas (0: no bound of its own, for `concurrent`)."""

    priority: int = 0
    concurrent: int = 0
    sessions: int = 0
    session_tokens: int = 0
    stored_bytes: int = 0
    uploaded_bytes: int = 0


LIMIT_NAMES = tuple(field.name for field in fields(Limits))


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request: its tenant, its role, its tenant's limits and its
    tenant's /metrics label."""

    tenant: str
    role: Role
    limits: Limits
    label: str

    @property
    def serves(self) -> bool:
        """May use the data plane (as its tenant)."""
        return self.role is not Role.CONTROL_PLANE

    @property
    def controls(self) -> bool:
        """May change the server (LoRA load and unload)."""
        return self.role is not Role.TENANT


class Tenants:
    """The configured tenants and each one's limits."""

    def __init__(
        self,
        configured: Iterable[str],
        defaults: Limits,
        overrides: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self.configured = frozenset(configured)
        self.defaults = defaults
        self._limits = {
            tenant: replace(defaults, **dict(values))
            for tenant, values in (overrides or {}).items()
        }

    def limits(self, tenant: str) -> Limits:
        return self._limits.get(tenant, self.defaults)

    def label(self, tenant: str) -> str:
        """`tenant` as /metrics names it: a configured tenant by its id, any other as
        `other` (bounded labels, whatever a router forwards)."""
        return tenant if tenant in self.configured else OTHER_TENANTS

    def principal(self, tenant: str, role: Role) -> Principal:
        return Principal(tenant, role, self.limits(tenant), self.label(tenant))


def parse_limits(entry: str) -> tuple[str, dict[str, int]]:
    """`TENANT_ID:name=value,...` -> the tenant (or `*`) and its limits; ValueError
    naming what is wrong."""
    tenant, sep, rest = entry.partition(":")
    if not sep or not tenant:
        raise ValueError(f"tenant limits {entry!r} are not TENANT_ID:name=value,...")
    values: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in LIMIT_NAMES:
            raise ValueError(
                f"tenant limits {entry!r}: {part!r} is not name=value with a name among "
                f"{', '.join(LIMIT_NAMES)}"
            )
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"tenant limits {entry!r}: {value!r} is not an integer") from None
        if name != "priority" and values[name] < 0:
            raise ValueError(f"tenant limits {entry!r}: {name} may not be negative")
    return tenant, values


def share(bound: int, tenants: int) -> int:
    """An equal share of `bound` among `tenants` (at least 1 of a bound of 1 or more)."""
    return max(1, bound // max(1, tenants)) if bound > 0 else 0
