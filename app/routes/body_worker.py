"""Big request bodies parsed in child processes, off the serving process's interpreter lock.

Parsing a body is CPU the serving process cannot share out: orjson and the value count of
`app.protocols.bodies` hold the interpreter lock for as long as they run (a 16 MiB chat
body: about 75 ms a request, measured with py-spy), as GraphPipe's decoding does for its
Python loops even in a worker thread, so the event loop, and every other client's
request with it, waited for them. `BodyWorker.parse` is the one rule: a body over
`IN_CHILD_BYTES` is parsed by one of `CHILDREN` child processes (`python -m
app.routes.body_worker`, each started on first use, started again if it dies) fed the
body through a pipe, answering the parsed value (pickled) or the `SwitchboardError`
parsing raised, which the caller gets as if it had parsed the body itself; a smaller
body is parsed where it is read (`Job.small_in_thread`: in a worker thread). The
serving process only moves bytes for a big one (the pipe's reads and writes release the
lock; unpickling the answer is a copy).

Each child takes a session of its own whose scheduling group (autogroup) runs at
`CHILD_NICENESS` (`app.engine.cpu_host.own_session`, as the engine core does): a niceness
weighs only within its group, so in the serving process's group it gave way to the
frontend's threads only, and took CPU as a whole group's share beside the engine's
niced one. It ends with the serving process: SIGTERM when the thread that started it
ends (`own_session`), and its stdin's end, however the serving process ends.

Fair per client: a child runs one job at a time, to its end (a job is never interrupted
half-way, so the pipe's frames stay in step; a job whose caller left before it started
is dropped), and a free child takes the next job of the waiting client with the fewest
jobs running, clients in turn among equals (`client`: `client_of`, the request's tenant
where a key named one, else its peer's address). So a client
sending big bodies back to back holds at most one child while another client waits,
and a legitimate big body (a chat with a large image) waits for at most one job of each
other client, not for a hostile client's whole queue. The children import only the
protocol cores they run (no framework, no vLLM).
"""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from app.errors import SwitchboardError
from app.heap import trim, trim_soon
from app.pipe_child import child_outbox, start_child, stop_child
from app.tenants import DEFAULT_TENANT, Principal

# A body larger than this is parsed in a child: about a millisecond of parsing on the
# event loop (orjson and the value count run at ~0.25-0.5 GB/s on one core here).
IN_CHILD_BYTES = 256 << 10
# Children at most: a client's big bodies hold one while another client's wait for the
# other; each costs its interpreter (~40 MiB) once started.
CHILDREN = 2
# The children's group gives way to every other session on the host, the engine's
# (niced 10 by default) included: a body is parsed with what CPU is left over.
CHILD_NICENESS = 19


@dataclass(frozen=True)
class Pieces:
    """A body as its transport read it: its chunks in order, `size` bytes in all. A big
    one goes to a child chunk by chunk, never joined in the serving process: joining 16
    MiB faulted in fresh pages for ~11 ms of the event loop, holding the interpreter lock
    (the chunks themselves are small, from the heap's reused pages)."""

    chunks: tuple[bytes, ...]
    size: int

    def __len__(self) -> int:
        return self.size

    def joined(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


Raw = bytes | bytearray | str | Pieces  # a body, or a websocket's text frame
_REQUEST_HEAD = struct.Struct("<QQ")  # the job's pickled name and arguments, the body
_ANSWER_HEAD = struct.Struct("<Q")


def _json(raw: bytes) -> Any:
    from app.protocols.bodies import parse_json

    return parse_json(raw)


def _graphpipe(raw: bytes, max_bytes: int) -> Any:
    from app.protocols.graphpipe.decode import decode_request

    return decode_request(raw, max_bytes=max_bytes)


def client_of(principal: Principal | None, peer: str | None) -> Hashable:
    """Whose turn a body is parsed in: its tenant's, where the server knows one (a key of
    `--tenant-api-key` named it: its users share one turn, wherever they connect from),
    else its peer's address (the keyless server's, or a key of no tenant: clients behind
    one proxy then share a turn)."""
    if principal is not None and principal.tenant != DEFAULT_TENANT:
        return ("tenant", principal.tenant)
    return ("peer", peer)


@dataclass(frozen=True)
class Job:
    run: Callable[..., Any]
    # A small body parsed in a worker thread rather than on the event loop: GraphPipe's
    # decoding loops in Python for a while even within the size (JSON's parse of 256 KiB
    # is about a millisecond).
    small_in_thread: bool = False


JOBS: dict[str, Job] = {"json": Job(_json), "graphpipe": Job(_graphpipe, small_in_thread=True)}


def _exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"the pipe ended after {len(data)} of {size} bytes")
    return data


class _Child:
    """One child process and the one thread that talks to it."""

    def __init__(self, index: int) -> None:
        # The thread that starts the child must outlive it: the child's SIGTERM is tied
        # to it (`own_session`). An executor's thread lives until `shutdown`.
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"body-worker-{index}")
        self.process: subprocess.Popen[bytes] | None = None
        self._guard = threading.Lock()  # `stop` beside a job

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            self.process = start_child(__name__, str(os.getpid()))
        return self.process

    def call(self, job: str, raw: Raw, arguments: dict[str, Any]) -> tuple[str, Any]:
        if isinstance(raw, str):  # in this thread: the copy off the event loop at least
            raw = raw.encode("utf-8", "surrogatepass")
        with self._guard:
            child = self._started()
            assert child.stdin is not None and child.stdout is not None
            try:
                head = pickle.dumps((job, arguments))
                child.stdin.write(_REQUEST_HEAD.pack(len(head), len(raw)) + head)
                child.stdin.writelines(raw.chunks if isinstance(raw, Pieces) else (raw,))
                child.stdin.flush()
                (size,) = _ANSWER_HEAD.unpack(_exactly(child.stdout, _ANSWER_HEAD.size))
                answer: tuple[str, Any] = pickle.loads(_exactly(child.stdout, size))
                return answer
            except (OSError, EOFError) as exc:  # the child died (its memory, a signal)
                self._stop()
                return "failed", exc

    def _stop(self) -> None:
        child, self.process = self.process, None
        if child is not None:
            stop_child(child)

    def stop(self) -> None:
        with self._guard:
            self._stop()
        self.thread.shutdown(wait=False)


@dataclass
class _Pending:
    answer: asyncio.Future[tuple[str, Any]]
    job: str
    raw: Raw
    arguments: dict[str, Any]
    client: Hashable = field(default=None)


class BodyWorker:
    """The serving process's end: `await worker.parse(job, raw, client=..., **arguments)`.
    Used from one event loop (the scheduling state is the loop's alone)."""

    def __init__(self, children: int = CHILDREN) -> None:
        self._children = [_Child(i) for i in range(children)]
        self._idle = list(reversed(self._children))  # the first child is used first
        self._waiting: dict[Hashable, deque[_Pending]] = {}  # in turn: dict order
        self._running: Counter[Hashable] = Counter()
        self._closed = False

    async def parse(self, job: str, raw: Raw, *, client: Hashable, **arguments: Any) -> Any:
        """`JOBS[job].run(raw, **arguments)`: its value, or its error raised; in a child
        when `raw` is over `IN_CHILD_BYTES`, for `client` in its turn (a `str`, a
        websocket's text frame, goes to the child as its UTF-8)."""
        if len(raw) <= IN_CHILD_BYTES:
            run = JOBS[job].run
            whole = raw.joined() if isinstance(raw, Pieces) else raw
            if JOBS[job].small_in_thread:
                return await asyncio.to_thread(run, whole, **arguments)
            return run(whole, **arguments)
        return await self.run(job, raw, client=client, **arguments)

    async def run(self, job: str, raw: Raw, *, client: Hashable = None, **arguments: Any) -> Any:
        """`JOBS[job].run(raw, **arguments)` in a child, whatever `raw`'s size."""
        loop = asyncio.get_running_loop()
        pending = _Pending(loop.create_future(), job, raw, arguments, client)
        if self._closed:
            pending.answer.set_result(("failed", "the body worker was closed"))
        else:
            self._waiting.setdefault(client, deque()).append(pending)
            self._dispatch()
        try:
            kind, value = await pending.answer  # a caller that leaves cancels it: dropped
        finally:
            trim_soon()  # the body's copies here, once the request is over (`app.heap`)
        if kind == "error":
            raise value
        if kind == "failed":
            raise SwitchboardError.withholding("The request body could not be read", value)
        return value

    def _next(self) -> _Pending | None:
        """The next job to run: of the waiting client with the fewest jobs running, the
        one waiting longest among equals (a client served goes to the end of the turn)."""
        while self._waiting:
            client = min(self._waiting, key=lambda c: self._running[c])
            queue = self._waiting.pop(client)
            pending = queue.popleft()
            if queue:
                self._waiting[client] = queue
            if not pending.answer.cancelled():
                return pending
        return None

    def _dispatch(self) -> None:
        while self._idle and not self._closed and (pending := self._next()) is not None:
            child = self._idle.pop()
            self._running[pending.client] += 1
            done = asyncio.get_running_loop().run_in_executor(
                child.thread, child.call, pending.job, pending.raw, pending.arguments
            )
            done.add_done_callback(functools.partial(self._finished, child, pending))

    def _finished(
        self, child: _Child, pending: _Pending, done: asyncio.Future[tuple[str, Any]]
    ) -> None:
        self._running[pending.client] -= 1
        if not self._running[pending.client]:
            del self._running[pending.client]
        self._idle.append(child)
        if not pending.answer.done():
            if done.cancelled():
                pending.answer.set_result(("failed", "the body worker was closed"))
            elif (error := done.exception()) is not None:
                pending.answer.set_exception(error)
            else:
                pending.answer.set_result(done.result())
        self._dispatch()

    async def close(self) -> None:
        self._closed = True
        for queue in self._waiting.values():
            for pending in queue:
                if not pending.answer.done():
                    pending.answer.set_result(("failed", "the body worker was closed"))
        self._waiting.clear()
        await asyncio.gather(*(asyncio.to_thread(child.stop) for child in self._children))


def _answer(inbox: IO[bytes], head: bytes) -> bytes:
    """The pickled answer to the job whose frame begins with `head`."""
    head_size, body_size = _REQUEST_HEAD.unpack(head)
    job, arguments = pickle.loads(_exactly(inbox, head_size))
    raw = _exactly(inbox, body_size)
    try:
        answer: tuple[str, Any] = ("ok", JOBS[job].run(raw, **arguments))
    except SwitchboardError as exc:
        answer = ("error", exc)
    except Exception as exc:  # a bug of ours: the serving process logs it, withheld
        answer = ("failed", repr(exc))
    return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)


def _serve(inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """The child's loop: one job a frame, until its stdin ends; the memory a job held is
    given back once it is answered (`app.heap`: every job here is a big one)."""
    while head := inbox.read(_REQUEST_HEAD.size):
        if len(head) != _REQUEST_HEAD.size:
            return
        data = _answer(inbox, head)
        outbox.write(_ANSWER_HEAD.pack(len(data)))
        outbox.write(data)
        outbox.flush()
        del data
        trim()


def main() -> None:
    outbox = child_outbox(CHILD_NICENESS, int(sys.argv[1]), "the body worker's child")
    _serve(sys.stdin.buffer, outbox)


if __name__ == "__main__":
    main()
