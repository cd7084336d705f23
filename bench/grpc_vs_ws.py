"""Salience Generate and Evergreen GENERATE over native gRPC vs the websocket, on one
server (one engine).

For each protocol and C clients at once, each client runs R greedy generations of
`OUTPUT_TOKENS` tokens one after the other, over gRPC (the stubs generated from the
published protos, grpc.aio) and over the websocket (binary frames), alternating which
transport goes first over rounds. A Salience client keeps one session and rewinds it
(`truncating`) before each prompt; an Evergreen client keeps one session (a
StartSession call, or a socket) and sends a GENERATE with a fresh prompt node per
request. Both transports get the same prompts, so the same outputs (checked).

Per transport: output tok/s (wall time of the round), median time to the first decoded
token, and the server process's own CPU time per output token (`cpu_seconds`, the
frontend: the engine core is a child process and excluded). Medians over the rounds.
Salience counts tokens from Done; Evergreen reports none, so its "tokens" are output
fragments (one per engine step that produced text: about one a token).

Writes bench/results/grpc.json and the README table between the `bench:grpc` markers.

    .venv/bin/python bench/grpc_vs_ws.py [--rounds 5] [--clients 1 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import websockets
from common import (
    cpu_seconds,
    machine,
    markdown_table,
    start_server,
    stop_server,
    write_table,
)
from google.protobuf import struct_pb2

from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from schemas import salience_ws_pb2 as ws_pb

ROOT = Path(__file__).resolve().parent.parent
PORT, GRPC_PORT = 8127, 50127
OUTPUT_TOKENS = 64
REQUESTS_PER_CLIENT = 4
WS = f"ws://127.0.0.1:{PORT}"
TARGET = f"127.0.0.1:{GRPC_PORT}"

# A client's prompts, as text and as token ids (tokenized before the clock starts).
Prompts = list[tuple[str, list[int]]]
# One client's run: (seconds to each request's first token, outputs by prompt, tokens).
Result = tuple[list[float], dict[str, Any], int]
Client = Callable[[Prompts], Awaitable[Result]]


def _prompts(clients: int, round_: int) -> list[Prompts]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ROOT / ".cache" / "tiny-model" / "tokenizer.json"))
    out = []
    for c in range(clients):
        texts = [
            f"Story {round_}.{c}.{r}: once upon a time, in a land of code,"
            for r in range(REQUESTS_PER_CLIENT)
        ]
        out.append([(text, tokenizer.encode(text).ids) for text in texts])
    return out


# -- Salience ---------------------------------------------------------------------------


def _generate(session: str, ids: list[int]) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        session_id=session,
        append_tokens=ids,
        offset=0,
        truncating=True,
        max_tokens=OUTPUT_TOKENS,
        top_k=1,
    )


async def salience_grpc_client(prompts: Prompts) -> Result:
    ttfts, outputs, tokens = [], {}, 0
    async with grpc.aio.insecure_channel(TARGET) as channel:
        stub = salience_grpc.SalienceStub(channel)
        session = (await stub.OpenSession(pb.OpenSessionRequest(model="tiny"))).session_id
        for prompt, ids in prompts:
            start, first, decoded = time.perf_counter(), 0.0, []
            async for event in stub.Generate(_generate(session, ids)):
                if event.HasField("token"):
                    first = first or time.perf_counter() - start
                    decoded.append(event.token.id)
                else:
                    tokens += event.done.completion_tokens
            ttfts.append(first)
            outputs[prompt] = decoded
    return ttfts, outputs, tokens


async def salience_ws_client(prompts: Prompts) -> Result:
    ttfts, outputs, tokens = [], {}, 0
    async with websockets.connect(f"{WS}/salience/ws", max_size=None) as ws:
        await ws.send(
            ws_pb.ClientFrame(
                id="o", open_session=pb.OpenSessionRequest(model="tiny")
            ).SerializeToString()
        )
        session = ws_pb.ServerFrame.FromString(await ws.recv()).open_session.session_id
        for r, (prompt, ids) in enumerate(prompts):
            frame = ws_pb.ClientFrame(id=f"g{r}", generate=_generate(session, ids))
            start, first, decoded = time.perf_counter(), 0.0, []
            await ws.send(frame.SerializeToString())
            while True:
                reply = ws_pb.ServerFrame.FromString(await ws.recv())
                if reply.event.HasField("token"):
                    first = first or time.perf_counter() - start
                    decoded.append(reply.event.token.id)
                elif reply.event.HasField("done"):
                    tokens += reply.event.done.completion_tokens
                    break
                else:
                    raise RuntimeError(f"Generate failed: {reply}")
            ttfts.append(first)
            outputs[prompt] = decoded
    return ttfts, outputs, tokens


# -- Evergreen --------------------------------------------------------------------------


def _evergreen_request(r: int, prompt: str) -> service_pb.SessionMessage:
    config = struct_pb2.Struct()
    config.update({"temperature": 0, "max_tokens": OUTPUT_TOKENS})
    message = service_pb.SessionMessage()
    action = message.actions.add(name="GENERATE")
    action.inputs.add(name="prompt", id=f"p{r}")
    action.outputs.add(name="response", id=f"r{r}")
    action.configs.add().Pack(config)
    fragment = message.node_fragments.add(id=f"p{r}")
    fragment.chunk_fragment.metadata.mimetype = "text/plain"
    fragment.chunk_fragment.data = prompt.encode()
    return message


async def _evergreen_output(
    receive: Callable[[], Awaitable[service_pb.SessionMessage]], start: float
) -> tuple[bytes, float, int]:
    pieces, first, fragments = [], 0.0, 0
    while True:
        reply = await receive()
        if reply.actions:
            raise RuntimeError(f"session aborted: {reply}")
        for fragment in reply.node_fragments:
            first = first or time.perf_counter() - start
            pieces.append(fragment.chunk_fragment.data)
            fragments += 1
            if not fragment.continued:
                return b"".join(pieces), first, fragments


async def evergreen_grpc_client(prompts: Prompts) -> Result:
    ttfts, outputs, fragments = [], {}, 0
    async with grpc.aio.insecure_channel(TARGET) as channel:
        call = evergreen_grpc.EvergreenServiceStub(channel).StartSession()

        async def receive() -> service_pb.SessionMessage:
            message: service_pb.SessionMessage = await call.read()
            return message

        for r, (prompt, _) in enumerate(prompts):
            start = time.perf_counter()
            await call.write(_evergreen_request(r, prompt))
            text, first, n = await _evergreen_output(receive, start)
            ttfts.append(first)
            outputs[prompt] = text
            fragments += n
        await call.done_writing()
        if await call.read() is not grpc.aio.EOF:
            raise RuntimeError("the session sent more than its outputs")
    return ttfts, outputs, fragments


async def evergreen_ws_client(prompts: Prompts) -> Result:
    ttfts, outputs, fragments = [], {}, 0
    async with websockets.connect(f"{WS}/evergreen/ws", max_size=None) as ws:

        async def receive() -> service_pb.SessionMessage:
            return service_pb.SessionMessage.FromString(await ws.recv())

        for r, (prompt, _) in enumerate(prompts):
            start = time.perf_counter()
            await ws.send(_evergreen_request(r, prompt).SerializeToString())
            text, first, n = await _evergreen_output(receive, start)
            ttfts.append(first)
            outputs[prompt] = text
            fragments += n
    return ttfts, outputs, fragments


# -- the runs ---------------------------------------------------------------------------

PROTOCOLS: dict[str, dict[str, Client]] = {
    "salience": {"grpc": salience_grpc_client, "websocket": salience_ws_client},
    "evergreen": {"grpc": evergreen_grpc_client, "websocket": evergreen_ws_client},
}


async def _round(client: Client, prompts: list[Prompts], pid: int) -> dict[str, Any]:
    cpu = cpu_seconds(pid)
    start = time.perf_counter()
    results = await asyncio.gather(*(client(mine) for mine in prompts))
    wall = time.perf_counter() - start
    cpu = cpu_seconds(pid) - cpu
    tokens = sum(r[2] for r in results)
    outputs = {k: v for r in results for k, v in r[1].items()}
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "ttft_ms": statistics.median(t for r in results for t in r[0]) * 1000,
        "cpu_us_per_token": cpu / tokens * 1e6,
        "outputs": outputs,
    }


async def compare(protocol: str, clients: int, rounds: int, pid: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"grpc": [], "websocket": []}
    for round_ in range(rounds):
        order = ["grpc", "websocket"] if round_ % 2 == 0 else ["websocket", "grpc"]
        prompts = _prompts(clients, round_)
        done = {t: await _round(PROTOCOLS[protocol][t], prompts, pid) for t in order}
        if done["grpc"].pop("outputs") != done["websocket"].pop("outputs"):
            raise AssertionError(f"{protocol}: gRPC and the websocket generated differently")
        for transport, result in done.items():
            runs[transport].append(result)
    summary: dict[str, Any] = {"protocol": protocol, "clients": clients, "rounds": runs}
    for transport, results in runs.items():
        for key in ("tok_s", "ttft_ms", "cpu_us_per_token"):
            summary[f"{transport}_{key}"] = statistics.median(r[key] for r in results)
    summary["ratio"] = summary["grpc_tok_s"] / summary["websocket_tok_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    model = ROOT / ".cache" / "tiny-model"
    if not (model / "config.json").is_file():
        build = [sys.executable, "-m", "app.cli", "make-tiny-model", str(model)]
        import subprocess

        subprocess.run(build, check=True, cwd=ROOT)
    command = [sys.executable, "-m", "app.cli", "serve", "--model", str(model)]
    command += ["--served-model-name", "tiny", "--port", str(PORT), "--log-level", "warning"]
    command += ["--grpc-port", str(GRPC_PORT), "--dtype", "float32", "--max-model-len", "1024"]
    proc = start_server(command, PORT, results_dir / "grpc.log")
    try:
        rows = [
            asyncio.run(compare(protocol, clients, args.rounds, proc.pid))
            for protocol in PROTOCOLS
            for clients in args.clients
        ]
    finally:
        stop_server(proc)
    (results_dir / "grpc.json").write_text(
        json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "runs": rows}, indent=2
        )
    )
    table = "\n".join(
        [
            f"Greedy generations of {OUTPUT_TOKENS} tokens, {REQUESTS_PER_CLIENT} per client in a "
            f"row; one server, tiny model; medians of {args.rounds} alternating rounds. CPU: "
            "the server process's own (the frontend; the engine core excluded) per output token.",
            "",
            *markdown_table(
                [
                    "protocol",
                    "clients",
                    "gRPC tok/s",
                    "websocket tok/s",
                    "gRPC vs websocket",
                    "gRPC TTFT ms",
                    "websocket TTFT ms",
                    "gRPC CPU us/token",
                    "websocket CPU us/token",
                ],
                [
                    [
                        row["protocol"],
                        row["clients"],
                        f"{row['grpc_tok_s']:.0f}",
                        f"{row['websocket_tok_s']:.0f}",
                        f"{row['ratio']:.2f}x",
                        f"{row['grpc_ttft_ms']:.1f}",
                        f"{row['websocket_ttft_ms']:.1f}",
                        f"{row['grpc_cpu_us_per_token']:.0f}",
                        f"{row['websocket_cpu_us_per_token']:.0f}",
                    ]
                    for row in rows
                ],
            ),
        ]
    )
    write_table("grpc", table)
    print(table)


if __name__ == "__main__":
    main()
