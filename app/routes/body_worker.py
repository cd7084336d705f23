"""Big request bodies parsed in a child process, off the serving process's interpreter lock.

Parsing a body is CPU the serving process cannot share out: orjson and the value count of
`app.protocols.bodies` hold the interpreter lock for as long as they run (a 16 MiB chat
body: about 75 ms a request, measured with py-spy), as GraphPipe's decoding does for its
Python loops even in a worker thread, so the event loop, and every other client's
request with it, waited for them. A body over `IN_CHILD_BYTES` is parsed instead by
`BodyWorker`: one child process (`python -m app.routes.body_worker`, started on first
use, started again if it dies) fed the body through a pipe, answering the parsed value
(pickled) or the `SwitchboardError` parsing raised, which the caller gets as if it had
parsed the body itself. The serving process only moves bytes for it (the pipe's reads and
writes release the lock; unpickling the answer is a copy).

The child runs at a lower CPU priority (`CHILD_NICENESS`): the serving process's own
threads come first. It stays in the serving process's session, so its scheduling group
(autogroup), not the engine's, which is niced apart (`app.engine.cpu_host`). Small bodies
keep the fast path: parsed where they are read, no process hop.

Jobs run one at a time, in arrival order, on one thread of the worker's own: a job is
never interrupted half-way (a client that leaves does not cancel its parse), so the
pipe's frames stay in step. The child imports only the protocol cores it runs (no
framework, no vLLM), and exits when its stdin closes: with the serving process, however
that ends.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from app.errors import SwitchboardError

# A body larger than this is parsed in the child: about a millisecond of parsing on the
# event loop (orjson and the value count run at ~0.25-0.5 GB/s on one core here).
IN_CHILD_BYTES = 256 << 10
CHILD_NICENESS = 10

_REQUEST_HEAD = struct.Struct("<QQ")  # the job's pickled name and arguments, the body
_ANSWER_HEAD = struct.Struct("<Q")


def _json(raw: bytes) -> Any:
    from app.protocols.bodies import parse_json

    return parse_json(raw)


def _graphpipe(raw: bytes, max_bytes: int) -> Any:
    from app.protocols.graphpipe.decode import decode_request

    return decode_request(raw, max_bytes=max_bytes)


JOBS: dict[str, Callable[..., Any]] = {"json": _json, "graphpipe": _graphpipe}


def _exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"the pipe ended after {len(data)} of {size} bytes")
    return data


class BodyWorker:
    """The serving process's end: `await worker.run(job, raw, **arguments)`."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="body-worker")
        self._child: subprocess.Popen[bytes] | None = None
        self._guard = threading.Lock()  # `close` beside a job's thread

    async def run(self, job: str, raw: bytes | bytearray, **arguments: Any) -> Any:
        """`JOBS[job](raw, **arguments)` in the child: its value, or its error raised."""
        loop = asyncio.get_running_loop()
        kind, value = await loop.run_in_executor(self._thread, self._call, job, raw, arguments)
        if kind == "error":
            raise value
        if kind == "failed":
            raise SwitchboardError.withholding("The request body could not be read", value)
        return value

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            # The child imports what this process imported: its modules, from its path.
            path = os.pathsep.join(p for p in sys.path if p)
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": path},
            )
        return self._child

    def _call(self, job: str, raw: bytes | bytearray, arguments: dict[str, Any]) -> tuple[str, Any]:
        with self._guard:
            child = self._started()
            assert child.stdin is not None and child.stdout is not None
            try:
                head = pickle.dumps((job, arguments))
                child.stdin.write(_REQUEST_HEAD.pack(len(head), len(raw)) + head)
                child.stdin.write(raw)
                child.stdin.flush()
                (size,) = _ANSWER_HEAD.unpack(_exactly(child.stdout, _ANSWER_HEAD.size))
                answer: tuple[str, Any] = pickle.loads(_exactly(child.stdout, size))
                return answer
            except (OSError, EOFError) as exc:  # the child died (its memory, a signal)
                self._stop()
                return "failed", exc

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    async def close(self) -> None:
        def stop() -> None:
            with self._guard:
                self._stop()

        await asyncio.to_thread(stop)
        self._thread.shutdown(wait=False)


def _serve(inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """The child's loop: one job a frame, until its stdin ends."""
    while head := inbox.read(_REQUEST_HEAD.size):
        if len(head) != _REQUEST_HEAD.size:
            return
        head_size, body_size = _REQUEST_HEAD.unpack(head)
        job, arguments = pickle.loads(_exactly(inbox, head_size))
        raw = _exactly(inbox, body_size)
        try:
            answer: tuple[str, Any] = ("ok", JOBS[job](raw, **arguments))
        except SwitchboardError as exc:
            answer = ("error", exc)
        except Exception as exc:  # a bug of ours: the serving process logs it, withheld
            answer = ("failed", repr(exc))
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        outbox.write(_ANSWER_HEAD.pack(len(data)))
        outbox.write(data)
        outbox.flush()


def main() -> None:
    os.nice(CHILD_NICENESS)
    # The answers own stdout: anything a library prints goes to stderr instead.
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, outbox)


if __name__ == "__main__":
    main()
