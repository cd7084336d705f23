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
longer (on a CPU engine, 8 sequences step in ~3 ms, 32 in ~6). So the lane's width
follows interactive traffic: `max_running` while no interactive request is in flight (on
this replica: queued or running), `busy_running` while one is, and for `hold_s` after
the last one ended (a client's next request follows its last closely); past the width,
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


class Lane:
    def __init__(
        self,
        admission: Admission,
        *,
        max_running: int,
        busy_running: int,
        hold_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.admission = admission
        self.max_running = max_running
        self.busy_running = busy_running
        self.hold_s = hold_s
        self._clock = clock
        self._busy_until = 0.0
        self.running = 0  # batch requests in the engine (the runner counts them)
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
        return self.busy_running if now < self._busy_until else self.max_running

    def room(self) -> int:
        """How many more may start now."""
        return max(0, self.width() - self.running)

    def excess(self) -> int:
        """How many running are past the width (to take off the engine)."""
        return max(0, self.running - self.width())
