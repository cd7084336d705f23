"""Children of the server that answer over their pipes (the body worker's children,
`app.routes.body_worker`; the render process, `app.engine.vllm.render_process`): each
end's one rule for how such a child begins and how it is stopped.

`start_child` starts one: the server's modules, from its path, behind two pipes a MiB
wide (at the default 64 KiB a 16 MiB body crossed in 256 writes, each a wake of the
other end and the interpreter's lock taken again). A child takes a session of its own at
its niceness (on Linux: `app.engine.cpu_host.own_session`, which also ties its SIGTERM to
the server), and owns its stdout for its answers, whatever a library prints going to
stderr instead. The server stops one by closing its pipes (the child ends at its stdin's
end) and waiting a few seconds, then killing it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from typing import BinaryIO

from app.heap import fix_mmap_threshold

# How long a child may take to end once its pipes are closed, before it is killed.
_STOP_S = 5.0
# Each pipe's capacity: Linux's default most a process may ask (/proc/sys/fs/pipe-max-size).
PIPE_BYTES = 1 << 20


def start_child(module: str, *arguments: str) -> subprocess.Popen[bytes]:
    """`python -m module *arguments`, importing what this process imports (its modules,
    from its path), its stdin and stdout pipes `PIPE_BYTES` wide where the system allows."""
    path = os.pathsep.join(p for p in sys.path if p)
    process = subprocess.Popen(
        [sys.executable, "-m", module, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    )
    widen = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux's alone
    for pipe in (process.stdin, process.stdout):
        if widen is None or pipe is None:
            continue
        with contextlib.suppress(OSError):  # past the system's most: the default width
            fcntl.fcntl(pipe.fileno(), widen, PIPE_BYTES)
    return process


def child_outbox(niceness: int, server: int, who: str) -> BinaryIO:
    """In a child of `server`: its own session at `niceness` (`who` names it in the log),
    then the stream its answers go to (its stdout as it was; stdout itself now stderr)."""
    if sys.platform == "linux":
        from app.engine.cpu_host import own_session

        own_session(niceness, server, who)
    os.setpriority(os.PRIO_PROCESS, 0, niceness)  # within its group; where none, all
    fix_mmap_threshold()  # what a big job held, returned (`app.heap`)
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return outbox


def stop_child(process: subprocess.Popen[bytes]) -> None:
    """Close `process`'s pipes, then wait for it to end, killing it past `_STOP_S`."""
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()
    try:
        process.wait(timeout=_STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
