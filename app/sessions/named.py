"""Requests named by their client, for the routers' out-of-band aborts: SMG's `Abort`
RPC and llm-d's `/inference/v1/abort_requests` name a request by the `request_id` the
client gave it, while the engine runs it under ids of our own (unique per engine
request, several for `n`).

Names are the client's own, so they are its tenant's (`app.tenants`): a call is filed
under (tenant, name), and an abort reaches only the calls of the aborting caller's
tenant. Another tenant's name aborts nothing and is answered as a name no call holds,
so an abort tells no one which names another tenant runs (NOT_FOUND semantics, no
oracle).

`NamedRequests.add(tenant, name, tickets)` files a call's admission tickets under its
client's name once it is built (each ticket names the engine request it runs, whose id
the request's record makes: `app.admission.Ticket.start`); `abort(tenant, names)` aborts
the engine requests of every call of that tenant filed under those names that is still
alive, whose streams then end as aborted and whose admission places the road gives back
as any end gives them back. The registry holds calls weakly: a call that has ended
(however: finished, failed, its client gone) drops out by itself, so no transport has
to unfile one on every way out; names left with no call are swept once the registry has
doubled since its last sweep (so a sweep's cost is shared by the filings that made it).
Aborting a request that has just finished is harmless (the engine ignores an id it no
longer runs), and a name no call holds is no error: routers abort what they no longer
follow. One registry per app, shared by every transport that takes names.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable

from app.admission import Tickets
from app.engine.base import Engine

logger = logging.getLogger(__name__)

# The fewest names filed before the first sweep of names whose calls have all ended.
_SWEEP_AT = 1024


class NamedRequests:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._calls: dict[tuple[str, str], weakref.WeakSet[Tickets]] = {}
        self._sweep_at = _SWEEP_AT

    def add(self, tenant: str, name: str, call: Tickets) -> None:
        key = (tenant, name)
        calls = self._calls.get(key)
        if calls is None:
            if len(self._calls) >= self._sweep_at:
                self._calls = {k: c for k, c in self._calls.items() if c}
                self._sweep_at = max(_SWEEP_AT, 2 * len(self._calls))
            calls = self._calls[key] = weakref.WeakSet()
        calls.add(call)

    def engine_ids(self, tenant: str, names: Iterable[str]) -> list[str]:
        """The engine requests of `tenant`'s live calls filed under `names`."""
        return [
            ticket.request_id
            for name in names
            for call in list(self._calls.get((tenant, name), ()))
            for ticket in call.tickets
            if ticket.request_id is not None
        ]

    async def abort(self, tenant: str, names: Iterable[str]) -> int:
        """Abort every engine request of `tenant` filed under `names`; how many there
        were (for logs and tests: never answered to the client)."""
        ids = self.engine_ids(tenant, names)
        for engine_id in ids:
            try:
                await self._engine.abort(engine_id)
            except Exception:  # one failure must not spare the others
                logger.exception("aborting %s failed", engine_id)
        return len(ids)
