"""Honest clients beside one hostile client (issue 38): their time to first token while
each hostile request runs, against idle, on Switchboard and on `vllm serve` under the same
requests where they apply.

Per start: `HONEST` clients each stream one chat after another (a short prompt, 8 output
tokens), and their TTFT (the first content chunk) is taken over `--phase` seconds, first
with nothing else (idle), then beside each hostile client in turn, which repeats its
request for as long as the phase lasts, from a process of its own (beside the honest
clients in their event loop it delayed their reading: `_Hostile`):

- a 16 MiB chat body (one message of 8 Mi words; refused on Switchboard before it is
  tokenized, being longer than the context);
- `/tokenize` of a 16 MiB prompt (it was tokenized on the event loop);
- a request's own chat template looping 4M times (nested loops: Jinja's sandbox refuses
  a single range past 100,000), on chat completions (both servers refuse it unless
  trusted: vLLM's rule; the phase shows what the refusal costs);
- GraphPipe's string tensor of 4,096 offsets to one 256 KiB string (Switchboard only);
- an urgent flood: 16 streamed completions at priority -1000 at a time (vLLM's scheduler
  runs smaller first; `vllm serve` runs first-come-first-served unless told otherwise);
- 64 connections that each send half a request head and wait (slowloris);
- 8 streamed completions whose reader stops reading after the head.

Figures per phase: the honest TTFT p50 and p99, their ratio to idle's (goal: within
1.5x), the honest requests served and failed, the hostile answers by status, and the
server's memory (`Memory`: RSS and PSS of each of its processes by role, the serving
process, Switchboard's render process and body worker's children, vLLM's engine), its
peak over the phase and what is left 3 s after the phase settled, each against
idle's after (flat: a peak bounded by what the request itself holds, and nothing left
that grows phase after phase). Between phases the
server settles: honest chats until one starts within 1.5x idle's p50 (at most 120 s; what
a hostile phase left running, a `vllm serve` tokenization of 16 MiB say, ends first), the
seconds it took kept as `settle_s`. Before the idle phase, each server's process tree
goes quiet (what it starts in the background once it answers /health is over; the
seconds kept as idle's `quiet_s`). Writes bench/results/hostile.json and the table
between the `bench:hostile` markers. Several alternating rounds, one server alive at a
time (about 20 minutes with the defaults; `--smoke`: one round of 3 s phases, nothing
published, about 6 minutes):

    PYTHONPATH=$PWD .venv/bin/python bench/hostile.py [--rounds 3] [--phase 15]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import harness
import psutil
from harness import Round, Server, Target, markdown_table, publish

from tests.graphpipe_hostile import shared_string

HONEST = 4
MIB = 1 << 20
BIG_TEXT = "x " * (8 * MIB)
TEMPLATE = "{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}"


@dataclass(frozen=True)
class _Where:
    """What a hostile client needs of the server it is sent to (`hostiles`)."""

    url: str
    port: int
    switchboard: bool


Hostile = Callable[[aiohttp.ClientSession, _Where, Counter[str]], Awaitable[None]]


def targets() -> list[Target]:
    return [harness.switchboard("switchboard"), harness.vllm_serve("vllm serve")]


HONEST_CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
    "stream": True,
}
SETTLE_S = 120.0
# A server whose processes used less CPU than this in a second has finished starting.
QUIET_CPU_S = 0.1
QUIET_S = 180.0
# Once a phase has settled, its memory is read this much later (past `app.heap`'s trim,
# a second after big requests end): what the server keeps.
AFTER_S = 3.0


def _first_token(line: bytes) -> bool:
    """An SSE line carrying generated text (not the role chunk's empty content)."""
    return line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line


async def _honest(
    session: aiohttp.ClientSession, url: str, ttfts: list[float], failed: Counter[str]
) -> None:
    body = HONEST_CHAT
    while True:
        start = time.perf_counter()
        try:
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    failed[str(response.status)] += 1
                    await response.read()
                    continue
                first = None
                async for raw in response.content:
                    if first is None and _first_token(raw):
                        first = time.perf_counter() - start
                if first is not None:
                    ttfts.append(first)
        except (TimeoutError, aiohttp.ClientError) as exc:
            failed[type(exc).__name__] += 1


async def _repeat(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    seen: Counter[str],
    kind: str = "application/json",
) -> None:
    while True:
        try:
            async with session.post(url, data=body, headers={"content-type": kind}) as response:
                await response.read()
                seen[str(response.status)] += 1
        except (TimeoutError, aiohttp.ClientError) as exc:
            seen[type(exc).__name__] += 1


def _posting(path: str, body: Callable[[], bytes], kind: str = "application/json") -> Hostile:
    data = body()

    async def hostile(session: aiohttp.ClientSession, server: _Where, seen: Counter[str]) -> None:
        await _repeat(session, server.url + path, data, seen, kind)

    return hostile


async def _urgent_flood(session: aiohttp.ClientSession, server: _Where, seen: Counter[str]) -> None:
    body = json.dumps(
        {"model": "tiny", "prompt": "a", "max_tokens": 256, "ignore_eos": True, "priority": -1000}
    ).encode()
    await asyncio.gather(
        *(_repeat(session, server.url + "/v1/completions", body, seen) for _ in range(16))
    )


Talk = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _raw_clients(
    server: _Where, seen: Counter[str], count: int, talk: Talk, limit: int = 1 << 16
) -> None:
    """`count` clients on raw sockets, each connecting again and again and running
    `talk` on its connection (a connection refused or reset counted in `seen`)."""

    async def one() -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", server.port, limit=limit
                )
                try:
                    await talk(reader, writer)
                finally:
                    writer.close()
            except OSError as exc:
                seen[type(exc).__name__] += 1
                await asyncio.sleep(0.1)

    await asyncio.gather(*(one() for _ in range(count)))


async def _half_heads(session: aiohttp.ClientSession, server: _Where, seen: Counter[str]) -> None:
    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-")
        await writer.drain()
        answer = await reader.read(64)  # until the server answers or closes
        status = answer.split(b" ")[1] if answer.startswith(b"HTTP/") else b"closed"
        seen[status.decode()] += 1

    await _raw_clients(server, seen, 64, talk)


async def _stalled_readers(
    session: aiohttp.ClientSession, server: _Where, seen: Counter[str]
) -> None:
    request = json.dumps(
        {"model": "tiny", "prompt": "a", "max_tokens": 900, "ignore_eos": True, "stream": True}
    ).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(request)

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(head + request)
        await writer.drain()
        await reader.read(64)  # the head, then it reads nothing more
        await asyncio.sleep(3600)

    await _raw_clients(server, seen, 8, talk, limit=1024)


def hostiles(server: _Where) -> dict[str, Hostile]:
    chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": BIG_TEXT}]})
    found: dict[str, Hostile] = {
        "16 MiB chat body": _posting("/v1/chat/completions", lambda: chat.encode()),
        "/tokenize of 16 MiB": _posting(
            "/tokenize", lambda: json.dumps({"model": "tiny", "prompt": BIG_TEXT}).encode()
        ),
        "request template looping 4M times": _posting(
            "/v1/chat/completions",
            lambda: json.dumps(
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1,
                    "chat_template_kwargs": {"chat_template": TEMPLATE},
                }
            ).encode(),
        ),
        "urgent flood (priority -1000)": _urgent_flood,
        "64 half-sent heads": _half_heads,
        "8 readers that stop reading": _stalled_readers,
    }
    if server.switchboard:
        found["GraphPipe string shared 4,096 times"] = _posting(
            "/graphpipe", lambda: shared_string(4096, 256 * 1024), "application/octet-stream"
        )
    return found


# The server's processes, as their memory is reported: its own (the frontend: Switchboard's
# serving process, `vllm serve`'s API server), Switchboard's render process and body
# worker's children, and vLLM's engine (its core and worker; whatever else runs below).
ROLES = ("serving", "render", "body workers", "engine")
_CHILD_ROLES = {"app.engine.vllm.render_child": "render", "app.routes.body_worker": "body workers"}


def _role(process: psutil.Process, root: psutil.Process) -> str:
    if process.pid == root.pid:
        return "serving"
    with contextlib.suppress(psutil.Error):
        command = process.cmdline()
        for module, role in _CHILD_ROLES.items():
            if module in command:
                return role
    return "engine"


def _pss(pid: int) -> int:
    """`pid`'s proportional set size (its private pages, and its share of those it maps
    with others: the libraries every process of the server maps), in bytes; 0 if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Memory:
    """The memory of the server's process tree, per role (`ROLES`) and in all, sampled
    every 0.2 s in a thread: RSS and PSS, the peak over the block and the last sample."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def sample(self) -> dict[str, float]:
        """One sample, in MiB: `<role> rss`, `<role> pss` for each role, `rss` and `pss`
        of the whole tree."""
        now = {f"{role} {kind}": 0.0 for role in ROLES for kind in ("rss", "pss")}
        for process in (self.root, *self.root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                role = _role(process, self.root)
                now[f"{role} rss"] += process.memory_info().rss / MIB
                now[f"{role} pss"] += _pss(process.pid) / MIB
        now["rss"] = sum(now[f"{role} rss"] for role in ROLES)
        now["pss"] = sum(now[f"{role} pss"] for role in ROLES)
        return now

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.last = self.sample()
            self.peak = {k: max(v, self.peak.get(k, 0.0)) for k, v in self.last.items()}
            time.sleep(0.2)

    def __enter__(self) -> Memory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _phase(server: Server, hostile: str | None, seconds: float) -> dict[str, Any]:
    """The honest clients for `seconds`, beside the hostile client named `hostile` (in a
    process of its own: `_Hostile`)."""
    ttfts: list[float] = []
    failed: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    beside = _Hostile(server, hostile, seconds) if hostile is not None else None
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if beside is not None:
            await asyncio.to_thread(beside.ready)
        tasks = [
            asyncio.ensure_future(_honest(session, server.url, ttfts, failed))
            for _ in range(HONEST)
        ]
        with Memory(server.pid) as memory:
            if beside is not None:
                beside.go()
            await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    seen = await asyncio.to_thread(beside.seen) if beside is not None else {}
    quantiles = statistics.quantiles(ttfts, n=100) if len(ttfts) > 1 else [float("nan")] * 99
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1e3 if ttfts else float("nan"),
        "ttft_p99_ms": quantiles[98] * 1e3,
        "served": len(ttfts),
        "failed": dict(failed),
        "hostile_answers": seen,
        "peak_mib": memory.peak,
    }


class _Hostile:
    """A hostile client in a process of its own, so that the honest clients' measurement
    is not its victim: beside them in one event loop, a client that sends a refused
    request back to back (~1,400 a second) delayed the honest clients' own reading, and
    the faster the server refused it the worse the honest TTFT read (a probe: 24-36 ms
    against 10-13 when each refusal took the prompt thread's turn)."""

    def __init__(self, server: Server, name: str, seconds: float) -> None:
        where = _Where(server.url, server.port, server.target.name.startswith("switchboard"))
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_hostile_child, args=(where, name, seconds, child))
        self._process.start()
        child.close()

    def ready(self) -> None:
        """Once its request is built (a 16 MiB body takes a while)."""
        self._pipe.recv()

    def go(self) -> None:
        self._pipe.send("go")

    def seen(self) -> dict[str, int]:
        """The answers it got, once its phase is over."""
        seen: dict[str, int] = self._pipe.recv()
        self._process.join()
        return seen


def _hostile_child(where: _Where, name: str, seconds: float, pipe: Connection) -> None:
    hostile = hostiles(where)[name]
    seen: Counter[str] = Counter()

    async def run() -> None:
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            pipe.send("ready")
            await asyncio.to_thread(pipe.recv)
            task = asyncio.ensure_future(hostile(session, where, seen))
            await asyncio.sleep(seconds)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    pipe.send(dict(seen))


async def _settle(server: Server, idle_ms: float) -> float:
    """Seconds until one honest chat starts within 1.5x idle's p50 TTFT (at most
    `SETTLE_S`): what a phase left running (a cut reader's request, a flood's, a
    tokenization no client waits for any more) ends before the next phase starts. Sent
    by the honest clients' own client (aiohttp), as they send theirs: httpx's, one new
    connection a chat, never started within 1.5x on Switchboard (120 s after every phase
    of the run of 2026-11-28, while `vllm serve`, with a slower idle, settled in 0-2 s)."""
    start = time.perf_counter()
    url = f"{server.url}/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=SETTLE_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.perf_counter() - start < SETTLE_S:
            sent = time.perf_counter()
            try:
                async with session.post(url, json=HONEST_CHAT) as response:
                    async for line in response.content:
                        if _first_token(line):
                            if (time.perf_counter() - sent) * 1e3 <= 1.5 * idle_ms:
                                return time.perf_counter() - start
                            break
            except (TimeoutError, aiohttp.ClientError):
                await asyncio.sleep(0.5)
    return time.perf_counter() - start


def _quiet(server: Server) -> float:
    """Seconds until the server's whole process tree is idle (at most `QUIET_S`): what it
    starts in the background once it answers /health is over before the idle phase
    (Switchboard's render process, vLLM's import at niceness 19, ~15 s of CPU; its
    memory is then in idle's)."""
    root = psutil.Process(server.pid)

    def cpu() -> float:
        total = 0.0
        for process in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    start = time.perf_counter()
    before = cpu()
    while time.perf_counter() - start < QUIET_S:
        time.sleep(1.0)
        now = cpu()
        if now - before < QUIET_CPU_S:
            break
        before = now
    return time.perf_counter() - start


def _after(server: Server) -> dict[str, float]:
    """The server's memory once a phase is over (`Memory.sample`), `AFTER_S` later."""
    time.sleep(AFTER_S)
    return Memory(server.pid).sample()


def measure(server: Server, round_: Round, seconds: float) -> dict[str, Any]:
    quiet_s = _quiet(server)
    server.warm("/v1/chat/completions")
    figures: dict[str, Any] = {"idle": asyncio.run(_phase(server, None, seconds))}
    figures["idle"]["quiet_s"] = quiet_s
    figures["idle"]["after_mib"] = _after(server)
    where = _Where(server.url, server.port, server.target.name.startswith("switchboard"))
    for name in hostiles(where):
        figures[name] = asyncio.run(_phase(server, name, seconds))
        figures[name]["settle_s"] = asyncio.run(_settle(server, figures["idle"]["ttft_p50_ms"]))
        figures[name]["after_mib"] = _after(server)
    return figures


def _growth(results: harness.Results, name: str, phase: str, key: str) -> str:
    """`key`'s peak over the phase and its value after it, each over idle's after, MiB
    (the median of the rounds)."""
    idle = results.per_round(name, "idle", "after_mib", key)
    peak = results.per_round(name, phase, "peak_mib", key)
    after = results.per_round(name, phase, "after_mib", key)
    grown = [statistics.median(a - b for a, b in zip(x, idle, strict=True)) for x in (peak, after)]
    return f"{grown[0]:+.0f} / {grown[1]:+.0f}"


def _phases(results: harness.Results, names: list[str]) -> list[str]:
    phases: list[str] = []
    for name in names:
        for starts in results.raw[name]:
            for figures in starts:
                phases += [p for p in figures if p not in phases and p != "idle"]
    return ["idle", *phases]


def table(results: harness.Results, names: list[str]) -> str:
    rows = []
    for phase in _phases(results, names):
        row: list[object] = [phase]
        for name in names:
            if not any(phase in f for starts in results.raw[name] for f in starts):
                row += ["(n/a)", "", ""]
                continue
            p50 = results.per_round(name, phase, "ttft_p50_ms")
            p99 = results.per_round(name, phase, "ttft_p99_ms")
            idle50 = results.per_round(name, "idle", "ttft_p50_ms")
            idle99 = results.per_round(name, "idle", "ttft_p99_ms")
            row += [
                f"{statistics.median(p50):.0f} / {statistics.median(p99):.0f}",
                f"{statistics.median(harness.ratios(p50, idle50)):.2f}x / "
                f"{statistics.median(harness.ratios(p99, idle99)):.2f}x",
                _growth(results, name, phase, "rss"),
            ]
        rows.append(row)
    header = ["hostile client"]
    for name in names:
        header += [f"{name}: honest TTFT p50 / p99 (ms)", "against idle", "RSS peak / after (MiB)"]
    lines = markdown_table(header, rows)
    # Switchboard's memory process by process (PSS: a page shared by n processes counts
    # 1/n in each, so the libraries every process maps are not counted n times).
    first = names[0]
    rows = [
        [phase, *(_growth(results, first, phase, f"{role} pss") for role in ROLES)]
        for phase in _phases(results, [first])
    ]
    header = [f"{first}: PSS peak / after (MiB)", *ROLES]
    return "\n".join([*lines, "", *markdown_table(header, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--smoke", action="store_true", help="one short round, nothing published")
    args = parser.parse_args()
    chosen = targets()
    rounds, seconds = (1, 3.0) if args.smoke else (args.rounds, args.phase)
    results = harness.run_rounds(
        chosen, lambda s, r: measure(s, r, seconds), rounds=rounds, name="hostile"
    )
    names = [t.name for t in chosen]
    text = table(results, names)
    if args.smoke:
        print(text)
        return
    publish("hostile", {"phase_s": seconds, "honest_clients": HONEST, **results.record()}, text)


if __name__ == "__main__":
    main()
