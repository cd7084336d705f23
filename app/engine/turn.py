"""The prompt turn: prompt work (templating, tokenizing, a grammar's compiling, images'
decoding) is done by one thread at a time, in the order the threads asked for it.

Invariants: one holder at a time (HF's fast tokenizers are not reentrant, and one build
at a time is what keeps a build's cost its own); turns are served first come, first
served (a queue of waiters, not a lock's free-for-all); a holder that waits on another
process for its prompt (`given_up`: a big prompt templated in the render process) gives
its turn up for as long as it waits and queues again after, so the builds behind it
go on meanwhile, and the waiting costs the others neither the turn nor the interpreter's
lock. `given_up` from a thread that does not hold the turn changes nothing.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class Turn:
    """`with turn:` holds it; `with turn.given_up():` inside lets it go meanwhile. Handed
    from holder to the longest waiter directly: a release wakes one thread, not all."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._holder: int | None = None  # the thread holding the turn
        self._waiting: deque[tuple[int, threading.Event]] = deque()

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._guard:
            if self._holder is None:
                self._holder = me
                return
            handed = threading.Event()
            self._waiting.append((me, handed))
        handed.wait()  # `__exit__` made this thread the holder before setting it

    def __exit__(self, *exc: object) -> None:
        with self._guard:
            if not self._waiting:
                self._holder = None
                return
            self._holder, handed = self._waiting.popleft()
        handed.set()

    @contextmanager
    def given_up(self) -> Iterator[None]:
        """Within it the turn is someone else's (when this thread held it)."""
        if self._holder != threading.get_ident():
            yield
            return
        self.__exit__()
        try:
            yield
        finally:
            self.__enter__()


# The one turn of the process's prompt work (`app.sessions.calls.in_prompt_thread`).
PROMPT_TURN = Turn()
