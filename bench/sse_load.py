"""A load client for SSE APIs that costs the server's core nothing: a child process pinned
to the engine's core (0) at real-time priority, reading each stream as raw bytes.

Why: the aiohttp clients of bench/clients.py parse every event as JSON and float between
the two cores; whenever they shared the frontend's core (1) the frontend's CPU per token
rose 1.5-3x, and which API of a round it hit decided the round (issue 21's Responses-vs-
chat ratios swung 0.7x-1.3x from run to run). Here each of `clients` keep-alive HTTP/1.1
connections (uvloop, an `asyncio.Protocol`) sends its `requests` POSTs one after another
and, per read, only counts bytes, keeps the stream's tail and looks for the end of the
chunked body; nothing is parsed until the run is over. `vllm-rs bench serve` (the
frontends bench) speaks only completions and chat; this speaks any SSE API, and the
Responses API's websocket mode (`Spec.websocket`: each client upgrades once, then sends
its requests as frames one after another, and only the frames' headers are read, to find
the frame that ends each answer; no permessage-deflate is asked for).

A stream is checked after the run: status 200, no error event in its tail, and the
output-token count the API reports in its last events (`usage_key`: chat's
`completion_tokens`, the Responses API's and Messages' `output_tokens`), which the caller
compares with what it asked for. TTFT: the first read holding `first_marker` (the first
text delta's event name or field).

    taskset -c 0 chrt --fifo 10 python bench/sse_load.py < SPEC.json   # prints the results
The parent side is `run` (`pinned=False`: the child runs where the kernel puts it, as a
client on the same host would).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

from harness import CLIENT_CORE, REALTIME, Server

TAIL = 16384  # bytes of each stream kept: its last events, where usage is
CPU = "frontend_cpu_us_per_tok"
END = b"0\r\n\r\n"  # the last chunk of a chunked body (an SSE chunk ends "\n\n\r\n")


@dataclass(frozen=True)
class Spec:
    port: int
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    clients: int
    requests: int  # per client
    first_marker: str
    usage_key: str
    max_tokens: int  # every request must report this many output tokens
    websocket: bool = False  # the body is a frame on a websocket opened at `path`


class _Stream(asyncio.Protocol):
    """One connection; `exchange` sends a request and waits for its whole answer."""

    def __init__(self, request: bytes, marker: bytes) -> None:
        self.request, self.marker = request, marker
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.head, self.tail, self.start, self.ttft = b"", b"", 0.0, 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if not self.head:
            self.head = data[:16]
        if not self.ttft and self.marker in data:
            self.ttft = time.perf_counter() - self.start
        self.tail = (self.tail + data)[-TAIL:]
        if self.tail.endswith(END) and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def exchange(self) -> tuple[float, bytes, bytes]:
        """(seconds to the first marker, the status line's start, the stream's tail)"""
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.head, self.tail, self.ttft = b"", b"", 0.0
        self.start = time.perf_counter()
        self.transport.write(self.request)
        await self.done
        return self.ttft, self.head, self.tail


# The first bytes of a frame that ends a response on the Responses API's websocket.
_ENDS = tuple(
    b'{"type":"' + kind + b'"'
    for kind in (b"response.completed", b"response.incomplete", b"response.failed", b"error")
)


class _Socket(asyncio.Protocol):
    """One websocket; `exchange` sends a frame and waits for the frame that ends its
    answer. Frames are found by their headers (the server's are never masked) and only
    the payload's first bytes are looked at; like `_Stream`, nothing else is parsed."""

    def __init__(self, frame: bytes, marker: bytes) -> None:
        self.frame, self.marker = frame, marker
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.upgraded: asyncio.Future[None] | None = None
        self.buffer = bytearray()
        self.head, self.tail, self.start, self.ttft = b"", b"", 0.0, 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    async def upgrade(self, request: bytes) -> None:
        assert self.transport is not None
        self.upgraded = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        await self.upgraded

    def data_received(self, data: bytes) -> None:
        if self.upgraded is not None and not self.upgraded.done():
            self.buffer += data
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head = bytes(self.buffer[:16])
            data = bytes(self.buffer[end + 4 :])
            self.buffer.clear()
            self.upgraded.set_result(None)
        if not self.ttft and self.marker in data:
            self.ttft = time.perf_counter() - self.start
        self.tail = (self.tail + data)[-TAIL:]
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 2:
            size, at = buffer[1] & 0x7F, 2
            if size == 126:
                size, at = int.from_bytes(buffer[2:4], "big"), 4
            elif size == 127:
                size, at = int.from_bytes(buffer[2:10], "big"), 10
            if len(buffer) < at + size:
                return
            ends = bytes(buffer[at : at + 40]).startswith(_ENDS)
            del buffer[: at + size]
            if ends and self.done is not None and not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        for waiting in (self.done, self.upgraded):
            if waiting is not None and not waiting.done():
                waiting.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def exchange(self) -> tuple[float, bytes, bytes]:
        """(seconds to the first marker, the upgrade's status line, the answer's tail)"""
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.tail, self.ttft = b"", 0.0
        self.start = time.perf_counter()
        self.transport.write(self.frame)
        await self.done
        return self.ttft, self.head, self.tail


def _upgrade(spec: Spec) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    head = [
        f"GET {spec.path} HTTP/1.1",
        f"host: 127.0.0.1:{spec.port}",
        "upgrade: websocket",
        "connection: Upgrade",
        f"sec-websocket-key: {key}",
        "sec-websocket-version: 13",
        *(f"{k}: {v}" for k, v in spec.headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


def _text_frame(payload: bytes) -> bytes:
    """One masked text frame (a client's must be)."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = bytes([0x81, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([0x81, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x81, 0x80 | 127]) + size.to_bytes(8, "big")
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


def _request(spec: Spec) -> bytes:
    body = json.dumps(spec.body).encode()
    head = [
        f"POST {spec.path} HTTP/1.1",
        f"host: 127.0.0.1:{spec.port}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        *(f"{k}: {v}" for k, v in spec.headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


FAILED = (b'"type":"error"', b"response.failed", b'data: {"error"')  # Responses, Messages; chat


def _tokens(head: bytes, tail: bytes, usage_key: str) -> int:
    """A stream's output tokens, from its tail (raises on a failed stream)."""
    ok = head.startswith((b"HTTP/1.1 200", b"HTTP/1.1 101"))
    if not ok or any(sign in tail for sign in FAILED):
        raise RuntimeError(f"a stream failed: {head!r} ... {tail[-600:]!r}")
    counts = re.findall(rb'"' + usage_key.encode() + rb'":\s*(\d+)', tail)
    if not counts:
        raise RuntimeError(f"no {usage_key} in a stream's tail: {tail[-600:]!r}")
    return int(counts[-1])


async def _client(spec: Spec, request: bytes) -> list[tuple[float, int]]:
    loop = asyncio.get_running_loop()
    marker = spec.first_marker.encode()
    stream: _Stream | _Socket
    if spec.websocket:
        _, stream = await loop.create_connection(
            lambda: _Socket(request, marker), "127.0.0.1", spec.port
        )
        await stream.upgrade(_upgrade(spec))
    else:
        _, stream = await loop.create_connection(
            lambda: _Stream(request, marker), "127.0.0.1", spec.port
        )
    runs = []
    for _ in range(spec.requests):
        ttft, head, tail = await stream.exchange()
        runs.append((ttft, _tokens(head, tail, spec.usage_key)))
    assert stream.transport is not None
    stream.transport.close()
    return runs


async def _load(spec: Spec) -> dict[str, Any]:
    request = _text_frame(json.dumps(spec.body).encode()) if spec.websocket else _request(spec)
    start = time.perf_counter()
    runs = await asyncio.gather(*(_client(spec, request) for _ in range(spec.clients)))
    wall = time.perf_counter() - start
    every = [run for client in runs for run in client]
    if any(ttft == 0.0 for ttft, _ in every):
        raise RuntimeError(f"a stream never showed {spec.first_marker!r}")
    return {
        "wall_s": wall,
        "ttft_p50_ms": statistics.median(t for t, _ in every) * 1000,
        "tokens": [n for _, n in every],
    }


def chat(port: int, model: str, prompt: str, max_tokens: int, c: int, n: int) -> Spec:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    body |= {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions"
    marker = '"delta":{"content":"'
    return Spec(port, path, body, {}, c, n, marker, "completion_tokens", max_tokens)


def completions(port: int, model: str, prompt: list[int], max_tokens: int, c: int, n: int) -> Spec:
    """A prompt of token ids, as `vllm-rs bench serve --prompt-token-ids` sends."""
    body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens}
    body |= {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    marker = '"text":"'
    return Spec(port, "/v1/completions", body, {}, c, n, marker, "completion_tokens", max_tokens)


def responses(
    port: int, model: str, prompt: str, max_tokens: int, c: int, n: int, *, store: bool
) -> Spec:
    body = {"model": model, "input": prompt, "temperature": 0, "store": store, "stream": True}
    body |= {"max_output_tokens": max_tokens, "ignore_eos": True}
    marker = "output_text.delta"
    return Spec(port, "/v1/responses", body, {}, c, n, marker, "output_tokens", max_tokens)


def responses_ws(port: int, model: str, prompt: str, max_tokens: int, c: int, n: int) -> Spec:
    """The Responses API's websocket mode: a `response.create` frame per request, not
    stored, each client on a websocket of its own."""
    body = {"type": "response.create", "model": model, "input": prompt, "temperature": 0}
    body |= {"store": False, "max_output_tokens": max_tokens, "ignore_eos": True}
    marker = "output_text.delta"
    return Spec(port, "/v1/responses", body, {}, c, n, marker, "output_tokens", max_tokens, True)


def messages(port: int, model: str, prompt: str, max_tokens: int, c: int, n: int) -> Spec:
    """Messages has no `ignore_eos`: the caller's prompt must not end early (checked)."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["messages"] = [{"role": "user", "content": prompt}]
    headers = {"anthropic-version": "2023-06-01"}
    path = "/v1/messages"
    return Spec(port, path, body, headers, c, n, "text_delta", "output_tokens", max_tokens)


def measure(spec: Spec, server: Server, *, pinned: bool = True) -> dict[str, float]:
    """Run `spec` (`run`) and read `server`'s frontend CPU around it (`Server.meter`).
    Every request must report `spec.max_tokens`."""
    max_tokens = spec.max_tokens
    with server.meter(tokens=False) as meter:
        result = run(spec, pinned=pinned)
    wrong = [n for n in result["tokens"] if n != max_tokens]
    if len(result["tokens"]) != spec.clients * spec.requests or wrong:
        raise AssertionError(f"{spec.path}: token counts {wrong[:5]} (wanted {max_tokens})")
    meter.wall_s = result["wall_s"]  # the client's clock: its start-up is not the server's
    figures = meter.figures(spec.clients * spec.requests * max_tokens)
    return {**figures, "ttft_p50_ms": result["ttft_p50_ms"]}


Load = Callable[[int, int, int], Spec]  # (port, clients, requests per client) -> a run


def take_turns(
    rows: dict[str, Load], server: Server, c: int, requests: int, turns: int, first: int
) -> dict[str, dict[str, float]]:
    """Each row's figures at `c` clients (`requests` per run, shared): the medians of
    `turns` runs in which the rows take turns (which goes first rotates, from `first`),
    with each row's CPU per token over the first row's in the same turn (`cpu_vs_first`,
    the median of those ratios). Why turns: a 2-core VM's speed drifts by tens of percent
    over seconds, alike for runs back to back, so ratios within a turn hold where ratios
    of whole runs did not. The first run of each row at `c` is a warm-up (a fresh engine's
    first batch of a size is slow), not counted."""
    each = max(1, requests // c)
    for load in rows.values():
        measure(load(server.port, c, 1), server)
    names = list(rows)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    for turn in range(turns):
        shift = (turn + first) % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(measure(rows[name](server.port, c, each), server))
    out = {}
    for name, figures in runs.items():
        m = {k: statistics.median(run[k] for run in figures) for k in figures[0]}
        m["cpu_vs_first"] = statistics.median(
            run[CPU] / base[CPU] for run, base in zip(figures, runs[names[0]], strict=True)
        )
        out[name] = m
    return out


async def rows_round(
    server: Server,
    rows: dict[str, tuple[Any, Load]],
    concurrency: list[int],
    requests: dict[int, int],
    turns: int,
    round_: int,
) -> dict[str, dict[int, dict[str, float]]]:
    """Every row's figures at every concurrency on one server: each row's path warmed and
    its output checked once by its parsing client (`OUTPUT_TOKENS` tokens), then the rows
    take turns (`take_turns`, `requests[c]` per run) under this load. A row's `cpu_vs_first`
    is its CPU per token over the first row's, within turns."""
    from clients import OUTPUT_TOKENS, PROMPT  # not in the child: it imports what it needs
    from clients import measure as measure_client

    for name, (client, _) in rows.items():
        _, runs = await measure_client(client, server, (PROMPT, []), 1, 1)
        if runs[0].tokens != OUTPUT_TOKENS:
            raise AssertionError(f"{name}: {runs[0].tokens} output tokens (an EOS?)")
    loads = {name: load for name, (_, load) in rows.items()}
    out: dict[str, dict[int, dict[str, float]]] = {name: {} for name in rows}
    for c in concurrency:
        figures = take_turns(loads, server, c, requests.get(c, 96), turns, round_)
        for name, m in figures.items():
            out[name][c] = m
            print(
                f"round {round_} {server.target.name} c={c} {name}: "
                f"{m['output_tok_s']:.0f} tok/s, {m[CPU]:.0f} us/tok, "
                f"{m['cpu_vs_first']:.2f}x the first row",
                file=sys.stderr,
                flush=True,
            )
    return out


def run(spec: Spec, *, pinned: bool = True) -> dict[str, Any]:
    """Run `spec` in a child (`pinned`: on `CLIENT_CORE` at real-time priority): wall
    seconds, TTFT p50 and each request's output tokens."""
    place = ["taskset", "-c", str(CLIENT_CORE), *REALTIME] if pinned else []
    done = subprocess.run(
        [*place, sys.executable, __file__],
        input=json.dumps(asdict(spec)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        raise RuntimeError(f"the load client failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    import uvloop

    spec = Spec(**json.loads(sys.stdin.read()))
    print(json.dumps(uvloop.run(_load(spec))))


if __name__ == "__main__":
    main()
