"""The graceful end of the server: one `Drain` per app, started by SIGTERM (`app.cli`).

The sequence, in order:

1. `begin()`: readiness turns 503 (`/ready`), and admission is closed, so every new
   request, action or session of every protocol is refused as `Overloaded` in its own
   shape; what registered with `on_begin` is told (Salience's sessions, which outlive
   connections, stop opening). Idempotent, synchronous: a signal handler may call it.
2. `run()` waits up to `timeout_s` for the work in flight (admission's tickets) to end by
   itself; what is left is then cut: its engine requests are aborted, and each protocol's
   stream ends with `Overloaded` in its shape (an SSE error event, a GraphPipe error, a
   Salience error frame, an Evergreen ABORT).
3. Every subscribed goodbye runs: each open session (a websocket, a gRPC stream) says
   its protocol's goodbye (`refusal()`, UNAVAILABLE) and closes; the drain waits for
   each goodbye to return, so a goodbye returns once its session is closed. Sessions
   do this through `app.sessions.lifetime.SessionLifetime`: `check_open()` as a
   session opens (refused as `Overloaded` once draining), its goodbye subscribed while
   it is served and unsubscribed when it closes.
4. `run()` returns no sooner than `grace_s` after `begin()`: until then the listener
   stays open, answering `/ready` with 503 and new work with refusals, so that a router
   probing `/ready` takes the replica out on what it answers rather than on connection
   errors after it has closed (which trip routers' circuit breakers, and keep a replica
   out long after it is back).

Then the caller stops the server and the engine. Transports never poll the drain: they
are refused by admission, or called by their goodbye.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from app.admission import Admission
from app.errors import Overloaded

logger = logging.getLogger(__name__)

Goodbye = Callable[[], Awaitable[None]]
Abort = Callable[[str], Awaitable[None]]

# How often the drain looks at the work in flight, and how long it gives streams whose
# requests it has aborted to say their last words.
_POLL_S = 0.05
_AFTER_CUT_S = 5.0
_GOODBYE_S = 5.0


class Drain:
    def __init__(self, admission: Admission, timeout_s: float, grace_s: float = 0.0) -> None:
        self.admission = admission
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self._goodbyes: set[Goodbye] = set()
        self._on_begin: list[Callable[[], None]] = []
        self.draining = False
        self._began = 0.0

    def refusal(self) -> Overloaded:
        """What a client is told when the drain refuses or ends its work."""
        return self.admission.shutting_down()

    def check_open(self) -> None:
        """Raise `refusal()` once draining: no new session."""
        if self.draining:
            raise self.refusal()

    def subscribe(self, goodbye: Goodbye) -> Callable[[], None]:
        """Call `goodbye` when the drain ends sessions; the returned function unsubscribes."""
        self._goodbyes.add(goodbye)
        return lambda: self._goodbyes.discard(goodbye)

    def on_begin(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the drain begins (at once if it has)."""
        self._on_begin.append(callback)
        if self.draining:
            callback()

    def begin(self) -> None:
        if not self.draining:
            self.draining = True
            self._began = time.monotonic()
            self.admission.close()
            for callback in self._on_begin:
                callback()
            logger.info("draining: new work is refused; %d in flight", self.admission.in_flight)

    async def run(self, abort: Abort) -> None:
        """The whole sequence; `abort` aborts one engine request by id."""
        self.begin()
        deadline = time.monotonic() + self.timeout_s
        await self._settle(deadline)
        ids = self.admission.cut()
        if self.admission.in_flight:
            logger.warning(
                "drain timeout (%.1f s): aborting %d request(s)", self.timeout_s, len(ids)
            )
        for request_id in ids:
            with contextlib.suppress(Exception):  # the engine may be gone already
                await abort(request_id)
        await self._settle(time.monotonic() + _AFTER_CUT_S)
        goodbyes = list(self._goodbyes)
        self._goodbyes.clear()
        if goodbyes:
            logger.info("draining: ending %d session(s)", len(goodbyes))
            await asyncio.wait(
                [asyncio.ensure_future(_say(g)) for g in goodbyes], timeout=_GOODBYE_S
            )
        await asyncio.sleep(max(0.0, self._began + self.grace_s - time.monotonic()))

    async def _settle(self, deadline: float) -> None:
        while self.admission.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)


async def _say(goodbye: Goodbye) -> None:
    try:
        await goodbye()
    except Exception:  # one session's failure must not keep the others from closing
        logger.exception("a session's goodbye failed")
