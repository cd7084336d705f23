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

Writes bench/results/grpc.json and the table between the
`bench:grpc` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/grpc_vs_ws.py \
        [--rounds 5] [--clients 1 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import harness
from clients import (
    Client,
    Prompt,
    evergreen_grpc,
    evergreen_ws,
    salience_grpc,
    salience_ws,
)
from harness import MODEL, Server, markdown_table, publish

OUTPUT_TOKENS = 64
REQUESTS_PER_CLIENT = 4


def _prompts(clients: int, round_: int) -> list[list[Prompt]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    out = []
    for c in range(clients):
        texts = [
            f"Story {round_}.{c}.{r}: once upon a time, in a land of code,"
            for r in range(REQUESTS_PER_CLIENT)
        ]
        out.append([(text, tokenizer.encode(text).ids) for text in texts])
    return out


# -- the runs ---------------------------------------------------------------------------

PROTOCOLS: dict[str, dict[str, Client]] = {
    "salience": {"grpc": salience_grpc, "websocket": salience_ws},
    "evergreen": {"grpc": evergreen_grpc, "websocket": evergreen_ws},
}


async def _round(client: Client, prompts: list[list[Prompt]], server: Server) -> dict[str, Any]:
    with server.meter(tokens=False) as meter:
        results = await asyncio.gather(*(client(server, mine, OUTPUT_TOKENS) for mine in prompts))
    wall, cpu = meter.wall_s, meter.cpu_s
    tokens = sum(r.tokens for r in results)
    outputs = [output for r in results for output in r.outputs]
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "ttft_ms": statistics.median(t for r in results for t in r.ttfts) * 1000,
        "cpu_us_per_token": cpu / tokens * 1e6,
        "outputs": outputs,
    }


async def compare(protocol: str, clients: int, rounds: int, server: Server) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"grpc": [], "websocket": []}
    for round_ in range(rounds):
        order = ["grpc", "websocket"] if round_ % 2 == 0 else ["websocket", "grpc"]
        prompts = _prompts(clients, round_)
        done = {t: await _round(PROTOCOLS[protocol][t], prompts, server) for t in order}
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
    harness.tiny_model()
    with harness.started(harness.switchboard("switchboard")) as server:
        rows = [
            asyncio.run(compare(protocol, clients, args.rounds, server))
            for protocol in PROTOCOLS
            for clients in args.clients
        ]
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
    publish("grpc", {"runs": rows}, table)


if __name__ == "__main__":
    main()
