"""Memory a big request held, given back to the system once it is freed.

glibc's allocator keeps what a process frees for its next allocations: a 16 MiB chat body
left the serving process ~65 MiB larger for good, the render process ~80 MiB and each
body worker's child ~45 MiB (bench/hostile.py, per process: its copies, pickled and
unpickled, and the template's and the parser's buffers, freed but kept in the allocator's
arenas, which the next such request reused, so they did not grow with repetition, but
did not shrink either). `trim` asks glibc to give every free page back (`malloc_trim(0)`:
free pages inside every arena, and the main heap's top): the render process and the
children now keep nothing of a big request.

- The server's pipe children (`app.pipe_child`: the body worker's, the render process)
  only ever do big work: each trims after every job (`trim`), in its own time.
- The serving process trims `TRIM_AFTER_S` after the end of a big piece of work (a body
  parsed by a child, a prompt rendered by the render process: `trim_soon`), in a thread
  of its own (the call lets the interpreter's lock go), at most once per `TRIM_AFTER_S`
  however many big requests end: a trim walks every arena (a few milliseconds here), and
  the request's own copies are freed by then.

`malloc_trim` does not shrink a thread's own heap (an arena of its own): what a thread
freed at its heap's top stays. glibc raises its mmap threshold to the largest block
freed (up to 32 MiB), so after a 16 MiB body, blocks of a few MiB came from the heaps of
the threads that moved them (the body worker's, the render process's) and stayed there.
`fix_mmap_threshold` (the serving process once started, each pipe child as it begins)
sets it once, which also stops glibc raising it: a block over `MMAP_THRESHOLD` is mapped
for itself and unmapped when freed. The serving process kept ~50 MiB after 16 MiB bodies
without it, +0 with it (bench/hostile.py's `Memory`, docs/benchmarks.md).

Where the C library is not glibc (no `malloc_trim`, no `mallopt`), all do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable

# After a big request ends, the serving process trims once this much later: its copies
# (the body, the parsed value, the prompt) are gone by then, and big requests that end
# meanwhile share the one trim.
TRIM_AFTER_S = 1.0


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function `name`; None where the C library has none."""
    function: Callable[..., int] | None = getattr(_LIBC, name, None)
    return function


_LIBC = _libc()  # found once a process (find_library runs ldconfig: milliseconds)
_MALLOC_TRIM = _glibc("malloc_trim")
_MALLOPT = _glibc("mallopt")
# Blocks over this are mapped for themselves: none is allocated per token.
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def fix_mmap_threshold() -> None:
    """Blocks over `MMAP_THRESHOLD` mapped for themselves from now on, and the threshold
    never raised (see the module docstring)."""
    if _MALLOPT is not None:
        _MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


_pending = threading.Lock()  # held while a trim is due: later requests share it


def trim() -> bool:
    """Give the process's free heap pages back to the system now; True if any were."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))


def trim_soon() -> None:
    """`trim` in `TRIM_AFTER_S`, in a thread, unless one is due already."""
    if _MALLOC_TRIM is None or not _pending.acquire(blocking=False):
        return
    try:
        threading.Thread(target=_trim_later, name="heap-trim", daemon=True).start()
    except RuntimeError:  # no thread can start (the interpreter is ending)
        _pending.release()


def _trim_later() -> None:
    try:
        time.sleep(TRIM_AFTER_S)
    finally:
        _pending.release()  # a request ending from now on is after this trim's start
    trim()
