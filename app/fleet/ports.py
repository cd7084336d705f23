"""Ports for processes that bind them later: chosen below the ephemeral range, claimed
across the machine's processes until the claimer exits.

A member of a fleet (or a test's server) binds its port tens of seconds or minutes after
the port is chosen: a replica once its engine has started, a router once every replica
is ready. Until then a port that is merely free is free for anyone. Below the kernel's
ephemeral range (32768 and up by default) no outgoing connection takes it, but another
process choosing the same way can: the test suite's two lanes each pick dozens, and one
lane's server bound the port the other's fleet had chosen for its router (CI: vllm-router
"Address already in use", every fleet test errored).

So a chosen port is claimed: a file named for it, created exclusively in one directory
all processes share, holding the claimer's pid. Nobody else picks a port while its claim
is held; a claim whose process has exited is taken over; this process's claims are
removed when it exits. A port also stays this process's alone for its life (a member
keeps its ports through restarts: routers know their workers by a static URL).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import socket
import tempfile
from pathlib import Path

_PORTS = range(20000, 32000)
_CLAIMS = Path(tempfile.gettempdir()) / "switchboard-ports"
_random = random.Random()
_mine: set[int] = set()


def free_port() -> int:
    """A port below the ephemeral range that nothing listens on now and that no other
    live process (nor this one, before) was given here."""
    while True:
        port = _random.choice(_PORTS)
        if port in _mine or not _claim(port):
            continue
        with socket.socket() as sock:
            try:
                # Every address: a router may bind its metrics port on all of them, which
                # fails where anything holds the port on any one.
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue  # kept claimed: something else holds it
        return port


def _claim(port: int) -> bool:
    """Claims `port` for this process; False if a live process holds its claim."""
    _CLAIMS.mkdir(parents=True, exist_ok=True)
    path = _CLAIMS / str(port)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _alive(_claimer(path)):
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # its claimer exited without removing it
            continue
        with os.fdopen(fd, "w") as claim:
            claim.write(str(os.getpid()))
        if not _mine:
            atexit.register(_release)
        _mine.add(port)
        return True
    return False


def _claimer(path: Path) -> int | None:
    try:
        return int(path.read_text() or "0") or None
    except (FileNotFoundError, ValueError):
        return None  # gone or half-written: taken as held, and another port is tried


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True  # a claim being written: not ours to take
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _release() -> None:
    pid = str(os.getpid())
    for port in _mine:
        path = _CLAIMS / str(port)
        with contextlib.suppress(OSError):
            if path.read_text() == pid:
                path.unlink()
