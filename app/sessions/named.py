"""Requests named by their client, for the routers' out-of-band aborts: SMG's `Abort`
RPC and llm-d's `/inference/v1/abort_requests` name a request by the `request_id` the
client gave it, while the engine runs it under ids of our own (unique per engine
request, several for `n`).

`NamedRequests.add(name, tickets)` files a call's admission tickets under its client's
name once it is built (each ticket names the engine request it runs, whose id the
request's record makes: `app.admission.Ticket.start`); `abort(names)` aborts the engine
requests of every call filed under those names
that is still alive, whose streams then end as aborted and whose admission places the
road gives back as any end gives them back. The registry holds calls weakly: a call
that has ended (however: finished, failed, its client gone) drops out by itself, so no
transport has to unfile one on every way out. Aborting a request that has just finished
is harmless (the engine ignores an id it no longer runs), and a name no call holds is
no error: routers abort what they no longer follow. One registry per app, shared by
every transport that takes names.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable

from app.admission import Tickets
from app.engine.base import Engine

logger = logging.getLogger(__name__)

# Names whose calls have all ended are swept once this many names are filed.
_SWEEP_AT = 1024


class NamedRequests:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._calls: dict[str, weakref.WeakSet[Tickets]] = {}

    def add(self, name: str, call: Tickets) -> None:
        calls = self._calls.get(name)
        if calls is None:
            if len(self._calls) >= _SWEEP_AT:
                self._calls = {n: c for n, c in self._calls.items() if c}
            calls = self._calls[name] = weakref.WeakSet()
        calls.add(call)

    def engine_ids(self, names: Iterable[str]) -> list[str]:
        return [
            ticket.request_id
            for name in names
            for call in list(self._calls.get(name, ()))
            for ticket in call.tickets
            if ticket.request_id is not None
        ]

    async def abort(self, names: Iterable[str]) -> int:
        """Abort every engine request filed under `names`; how many there were."""
        ids = self.engine_ids(names)
        for engine_id in ids:
            try:
                await self._engine.abort(engine_id)
            except Exception:  # one failure must not spare the others
                logger.exception("aborting %s failed", engine_id)
        return len(ids)
