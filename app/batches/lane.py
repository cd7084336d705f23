"""The batch lane: how many batch requests may be in the engine now, decided from what
admission holds (`app.admission`), so that interactive traffic never waits behind them.

Batch requests run at `BATCH_PRIORITY`, after every priority a client may ask for:

- admission measures a request only against the queued work of its priority or below,
  so queued batch requests never count against an interactive one (and its refusals,
  readiness and retry hints never see them);
- vLLM's priority scheduler (which the engine runs, `app.engine.vllm.startup`) schedules
  a waiting interactive request before any batch request, and preempts running batch
  requests first when the KV cache is short.

What the scheduler does not do is make room in the running batch: an interactive request
shares every engine step with the batch requests running, and each makes the step
longer (vLLM 0.32's CPU engine, the tiny model, 2 cores: 4-6 ms at 2 sequences, 6.5 at
16, 11-13 at 32, 25 at 128). So the lane's width follows interactive traffic:
`busy_running` while an interactive request is in flight (on this replica: queued or
running) and for `hold_s` after the last one ended (a client's next request follows its
last closely); `recent_running` for `recent_s` after that (traffic that paused comes
back, and its first requests wait for the engine step in flight: no one width keeps
that step short and the idle batch's pace up, docs/batches.md); `max_running` once no
interactive request has been in flight for longer; past the width,
the runner takes the newest batch requests off the engine (`excess`), to run again later
(their tokens so far are lost; the newest have made the least). It does so the moment an
interactive request is admitted (`Admission.on_admit`), before that request's prompt is
built: the engine gets their aborts before it gets the interactive request, whose first
step then runs without them. A draining server's lane is shut.

Single-threaded (the event loop's), like admission; no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.admission import LANE_PRIORITY, Admission, ProtocolName, Ticket

# After every priority a client may ask for (vLLM runs lower values first); admission
# keeps lane work out of each tenant's bound.
BATCH_PRIORITY = LANE_PRIORITY
# Admission's and /metrics' name for batch work.
PROTOCOL = ProtocolName.BATCH
# The idle width of an engine that does not say how many sequences it runs at once.
_UNKNOWN_IDLE_WIDTH = 64


def idle_width(configured: int, max_num_seqs: int) -> int:
    """The lane's width on an idle server: `configured`, or (0) the engine's
    `max_num_seqs` and half as many again. At exactly its running window, each batch
    request that finishes leaves its place empty until the runner has admitted and built
    the next (a batch's requests, alike, finish in waves), and the engine steps its
    refills a few prefills at a time; with some waiting in the engine, its scheduler fills
    the places in the same step, as `vllm run-batch`'s engine, which holds the whole file,
    does (measured on the tiny model, 1,000 requests: at 128, 0.6x run-batch's tok/s; at
    192 or 256, 0.9-1.0x). Not more: the wider the lane, the more the runner takes off the
    engine when an interactive request comes, and the longer that request's first step
    waits (at 256, 4 requests arriving together waited 110-230 ms for their first token;
    at 192, 85-190; alone, 25-80). Those waiting cost an interactive request nothing
    else: the priority scheduler runs it before any of them, and they are the first
    taken off (the newest)."""
    if configured:
        return configured
    return max_num_seqs * 3 // 2 if max_num_seqs else _UNKNOWN_IDLE_WIDTH


class Lane:
    def __init__(
        self,
        admission: Admission,
        *,
        max_running: int,
        busy_running: int,
        hold_s: float = 0.5,
        recent_running: int | None = None,
        recent_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.admission = admission
        self.max_running = max_running
        self.busy_running = busy_running
        self.hold_s = hold_s
        # After the hold, for `recent_s`: at most this many (interactive traffic that
        # paused is likely to come back, and its first requests wait for the step in
        # flight, whose length grows with the width), between the busy and idle widths.
        recent = max_running if recent_running is None else recent_running
        self.recent_running = min(max_running, max(busy_running, recent))
        self.recent_s = recent_s
        self._clock = clock
        self._busy_until = float("-inf")  # never busy yet
        # Batch requests in the engine, less those being taken off (the runner counts).
        self.running = 0
        # Called (by admission, synchronously) when an interactive request is admitted
        # while batch requests are past the busy width: the runner takes them off.
        self.on_busy: Callable[[], None] | None = None
        admission.on_admit.append(self._admitted)

    def _admitted(self, ticket: Ticket) -> None:
        if ticket.priority < BATCH_PRIORITY:
            self._busy_until = self._clock() + self.hold_s
            if self.on_busy is not None and self.running > self.busy_running:
                self.on_busy()

    def width(self) -> int:
        """How many batch requests may be in the engine now."""
        if self.admission.closed:
            return 0
        now = self._clock()
        if self.admission.in_flight_before(BATCH_PRIORITY):
            self._busy_until = now + self.hold_s
        if now < self._busy_until:
            return self.busy_running
        if now < self._busy_until + self.recent_s:
            return self.recent_running
        return self.max_running

    def room(self) -> int:
        """How many more may start now."""
        return max(0, self.width() - self.running)

    def excess(self) -> int:
        """How many running are past the width (to take off the engine)."""
        return max(0, self.running - self.width())
