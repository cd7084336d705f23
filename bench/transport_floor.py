"""What a transport alone costs the frontend per streamed message, with no engine and no
protocol: the floor under every "CPU per token" figure of the other benchmarks.

A bare server for each transport Switchboard streams tokens over, built on the very
libraries Switchboard runs on, holds C streams open and sends each stream one 64-byte
message per tick, as an engine step hands each running request one token: a shared
ticker every `--tick-ms` (1 ms at one stream, 3 ms at 16: about this machine's step
times with the tiny model) wakes every stream's task, which sends its message.

- SSE: uvicorn (httptools, uvloop), a raw ASGI app writing one `data:` event per message.
- websocket (sans-IO): uvicorn's `websockets-sansio` protocol, one binary frame each.
- websocket (legacy): uvicorn's deprecated `websockets` protocol (its default until now).
- gRPC: a grpcio asyncio server (uvloop), a unary-stream method, `context.write` each.
- none (ticks only): the streams wake on every tick as above and send nothing until one
  answer at the end: the ticker's and the wake-ups' own cost, subtracted from the others
  to give each transport's own cost per message.

The server process is pinned to core 1, where Switchboard's frontend runs beside vLLM's
engine on core 0 (`--pin-frontend`); the clients (aiohttp, websockets, grpc.aio: the
benchmarks' own) run on core 0. Per message: the server process's own user+sys CPU over
the run (`cpu_seconds`). Medians of `--rounds` rounds, the transports alternating order.

The difference between two floors is a cost no code above the transport can win back:
gRPC's over the websocket's bounds how close Salience or Evergreen over gRPC can come to
the same protocol over the websocket; the SSE floor plus the bare engine's output path
(bench/frontends.py's bare engine) bounds Switchboard's OpenAI CPU per token from below.

Writes bench/results/transport_floor.json and the table in docs/grpc.md between
the `bench:floor` markers.

    .venv/bin/python bench/transport_floor.py [--rounds 3] [--messages 6000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import websockets
from google.protobuf import wrappers_pb2
from harness import cpu_seconds, markdown_table, publish

ROOT = Path(__file__).resolve().parent.parent
PORT = 8131
PAYLOAD = b"x" * 64
NONE = "none (ticks only)"
TRANSPORTS = (NONE, "SSE", "websocket (sans-IO)", "websocket (legacy)", "gRPC")
UVICORN_WS = {"websocket (sans-IO)": "websockets-sansio", "websocket (legacy)": "websockets"}
SERVER_CORE, CLIENT_CORE = 1, 0
METHOD = "/floor.Floor/Stream"


class Ticker:
    """One tick wakes every stream waiting on it, as one engine step wakes every running
    request's consumer."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            event, self.event = self.event, asyncio.Event()
            event.set()

    async def wait(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._run())
        await self.event.wait()


def asgi_app(ticker: Ticker, messages: int) -> Callable[..., Awaitable[None]]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            for _ in range(messages):
                await ticker.wait()
                await send({"type": "websocket.send", "bytes": PAYLOAD})
            await send({"type": "websocket.close"})
        elif scope["path"] == "/ticks":
            for _ in range(messages):
                await ticker.wait()
            body = b"%d" % messages
            headers = [(b"content-length", b"%d" % len(body))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        else:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for _ in range(messages):
                await ticker.wait()
                event = b"data: " + PAYLOAD + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


async def grpc_server(ticker: Ticker, messages: int) -> None:
    async def stream(request: wrappers_pb2.BytesValue, context: Any) -> None:
        for _ in range(messages):
            await ticker.wait()
            await context.write(wrappers_pb2.BytesValue(value=PAYLOAD))

    handler = grpc.method_handlers_generic_handler(
        "floor.Floor",
        {
            "Stream": grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=wrappers_pb2.BytesValue.FromString,
                response_serializer=wrappers_pb2.BytesValue.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{PORT}")
    await server.start()
    await server.wait_for_termination()


def serve(transport: str, tick_s: float, messages: int) -> None:
    """The server process: pinned to the frontend's core, uvloop as Switchboard runs."""
    import uvicorn
    import uvloop

    os.sched_setaffinity(0, {SERVER_CORE})
    # The legacy websocket protocol is measured on purpose; its deprecation notice is not news.
    warnings.filterwarnings("ignore", message=".*websockets.* implementation is deprecated")
    if transport == "gRPC":
        uvloop.run(grpc_server(Ticker(tick_s), messages))
        return
    uvicorn.run(
        asgi_app(Ticker(tick_s), messages),
        host="127.0.0.1",
        port=PORT,
        loop="uvloop",
        http="httptools",
        ws=UVICORN_WS.get(transport, "websockets-sansio"),
        ws_per_message_deflate=False,
        log_level="error",
    )


async def stream_once(transport: str) -> int:
    """One client stream to its end; the messages it received."""
    received = 0
    if transport == "gRPC":
        async with grpc.aio.insecure_channel(f"127.0.0.1:{PORT}") as channel:
            call = channel.unary_stream(
                METHOD,
                request_serializer=wrappers_pb2.BytesValue.SerializeToString,
                response_deserializer=wrappers_pb2.BytesValue.FromString,
            )
            async for _ in call(wrappers_pb2.BytesValue()):
                received += 1
    elif transport in (NONE, "SSE"):
        path = "/ticks" if transport == NONE else "/"
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{PORT}{path}") as response,
        ):
            if transport == NONE:
                return int(await response.text())
            async for line in response.content:
                received += line.startswith(b"data: ")
    else:
        async with websockets.connect(f"ws://127.0.0.1:{PORT}/", compression=None) as ws:
            async for _ in ws:
                received += 1
    return received


async def wait_listening() -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", PORT)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise TimeoutError(f"nothing listens on {PORT}")


def measure(transport: str, streams: int, tick_s: float, messages: int) -> dict[str, float]:
    """One run: a fresh server, one warm-up stream, then `streams` streams at once."""
    context = multiprocessing.get_context("spawn")
    server = context.Process(target=serve, args=(transport, tick_s, messages), daemon=True)
    server.start()
    try:
        asyncio.run(wait_listening())
        asyncio.run(stream_once(transport))
        assert server.pid is not None
        cpu = cpu_seconds(server.pid)
        start = time.perf_counter()
        received = asyncio.run(_all(transport, streams))
        wall = time.perf_counter() - start
        cpu = cpu_seconds(server.pid) - cpu
    finally:
        server.kill()
        server.join()
    if received != streams * messages:
        raise AssertionError(f"{transport}: {received} of {streams * messages} messages")
    return {
        "cpu_us_per_message": cpu / received * 1e6,
        "messages_per_s": received / wall,
        "wall_s": wall,
    }


async def _all(transport: str, streams: int) -> int:
    return sum(await asyncio.gather(*(stream_once(transport) for _ in range(streams))))


def table(summary: dict[str, dict[str, dict[str, float]]], args: argparse.Namespace) -> str:
    rows = []
    for streams in args.streams:
        key = str(streams)
        none = summary[NONE][key]["cpu_us_per_message"]
        cheapest = min(summary[t][key]["cpu_us_per_message"] for t in TRANSPORTS if t != NONE)
        for transport in TRANSPORTS:
            m = summary[transport][key]
            rows.append(
                (
                    streams,
                    transport,
                    f"{m['messages_per_s']:.0f}",
                    f"{m['cpu_us_per_message']:.1f}",
                    "-" if transport == NONE else f"{m['cpu_us_per_message'] - none:.1f}",
                    "-" if transport == NONE else f"{m['cpu_us_per_message'] / cheapest:.2f}x",
                )
            )
    (s0, s1), (t0, t1) = args.streams, args.tick_ms
    head = (
        f"No engine: one 64-byte message per stream per tick, a tick every {t0:g} ms at {s0} "
        f"stream(s) and every {t1:g} ms at {s1}, runs of {args.messages * t0 / 1000:g} s; "
        f"server pinned to core {SERVER_CORE}, clients on core {CLIENT_CORE}; medians of "
        f"{args.rounds} alternating round(s). CPU: the server process's user+sys."
    )
    header = (
        "streams",
        "transport",
        "messages/s",
        "server CPU us/message",
        "the transport's own (minus ticks only)",
        "vs cheapest",
    )
    return "\n".join([head, "", *markdown_table(header, rows)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=6000, help="per stream at the first tick")
    parser.add_argument("--streams", type=int, nargs=2, default=[1, 16])
    parser.add_argument("--tick-ms", type=float, nargs=2, default=[1.0, 3.0])
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CORE})
    raw: dict[str, dict[str, list[dict[str, float]]]] = {t: {} for t in TRANSPORTS}
    for r in range(args.rounds):
        order = TRANSPORTS if r % 2 == 0 else tuple(reversed(TRANSPORTS))
        for transport in order:
            for streams, tick_ms in zip(args.streams, args.tick_ms, strict=True):
                # Every run lasts as long: as many ticks as --messages at the first tick.
                messages = max(1, round(args.messages * args.tick_ms[0] / tick_ms))
                figures = measure(transport, streams, tick_ms / 1000, messages)
                raw[transport].setdefault(str(streams), []).append(figures)
                print(
                    f"round {r} {transport} x{streams}: "
                    f"{figures['cpu_us_per_message']:.1f} us/message, "
                    f"{figures['messages_per_s']:.0f} messages/s",
                    flush=True,
                )
    summary = {
        t: {
            k: {f: statistics.median(run[f] for run in runs) for f in runs[0]}
            for k, runs in by_streams.items()
        }
        for t, by_streams in raw.items()
    }
    figures = {"args": vars(args), "median": summary, "rounds": raw}
    publish("floor", figures, table(summary, args), "transport_floor.json")


if __name__ == "__main__":
    sys.exit(main())
