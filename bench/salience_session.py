"""A Salience session grown turn by turn vs resending the whole prompt to /v1/completions.

One server (one engine) with a tiny model of 8,192 positions. Each turn appends a
200-token delta and decodes 16 tokens greedily; the Salience client sends only the delta,
the completions client the whole token list so far (as a chat client without sessions
must). Measured per turn: bytes the client sent, and time to the first decoded token.
Both sides hit vLLM's prefix cache equally; what differs is what crosses the wire and
what the server must parse. Writes bench/results/salience_session.json and the
table between the `bench:salience` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/salience_session.py [--turns 36]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import harness
import httpx
import numpy as np
import websockets
from harness import markdown_table, publish

DELTA, DECODE, PORT = 200, 16, harness.PORT


async def completions_turn(client: httpx.AsyncClient, ids: list[int]) -> tuple[int, float]:
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": ids,
            "max_tokens": DECODE,
            "top_k": 1,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    start = time.perf_counter()
    ttft = 0.0
    async with client.stream(
        "POST", "/v1/completions", content=body, headers={"content-type": "application/json"}
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and not ttft:
                ttft = time.perf_counter() - start
    return len(body), ttft


async def salience_turn(
    ws: Any, session: str, delta: list[int], offset: int, call: str
) -> tuple[int, float, int]:
    frame = json.dumps(
        {
            "id": call,
            "method": "Generate",
            "request": {
                "sessionId": session,
                "appendTokens": delta,
                "offset": offset,
                "maxTokens": DECODE,
                "topK": 1,
            },
        }
    )
    start = time.perf_counter()
    await ws.send(frame)
    ttft = 0.0
    while True:
        reply = json.loads(await ws.recv())
        event = reply["event"]
        if "token" in event and not ttft:
            ttft = time.perf_counter() - start
        if "done" in event:
            return len(frame.encode()), ttft, int(event["done"]["totalTokens"])


async def run(turns: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    rows = []
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=120) as client,
        websockets.connect(f"ws://127.0.0.1:{PORT}/salience/ws", max_size=None) as ws,
    ):
        await ws.send(
            json.dumps({"id": "o", "method": "OpenSession", "request": {"model": "tiny"}})
        )
        session = json.loads(await ws.recv())["response"]["sessionId"]
        await ws.send(
            json.dumps(
                {
                    "id": "w",
                    "method": "Generate",
                    "request": {
                        "sessionId": session,
                        "appendTokens": [5, 6],
                        "offset": 0,
                        "maxTokens": 2,
                    },
                }
            )
        )
        while "done" not in json.loads(await ws.recv())["event"]:
            pass
        await ws.send(
            json.dumps({"id": "d", "method": "DumpSession", "request": {"sessionId": session}})
        )
        history = [int(t) for t in json.loads(await ws.recv())["response"]["tokens"]]
        # The completions client grows its own conversation, so that neither side finds
        # its new tokens already in the prefix cache because of the other.
        other = list(history)
        for turn in range(turns):
            delta = rng.integers(10, 2000, DELTA).tolist()
            sent_s, ttft_s, total = await salience_turn(
                ws, session, delta, len(history), f"t{turn}"
            )
            other += rng.integers(10, 2000, DELTA).tolist()
            sent_c, ttft_c = await completions_turn(client, other)
            other += rng.integers(10, 2000, DECODE).tolist()  # stands in for its reply
            await ws.send(
                json.dumps(
                    {"id": f"d{turn}", "method": "DumpSession", "request": {"sessionId": session}}
                )
            )
            history = [int(t) for t in json.loads(await ws.recv())["response"]["tokens"]]
            assert len(history) == total
            rows.append(
                {
                    "turn": turn + 1,
                    "session_tokens": total,
                    "salience_bytes": sent_s,
                    "completions_bytes": sent_c,
                    "salience_ttft_ms": ttft_s * 1000,
                    "completions_ttft_ms": ttft_c * 1000,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=36)
    args = parser.parse_args()
    with harness.started(harness.switchboard("switchboard", long=True)):
        rows = asyncio.run(run(args.turns))
    lines = [
        f"Each turn appends {DELTA} tokens and decodes {DECODE}; one server, tiny model "
        "with 8,192 positions.",
        "",
        *markdown_table(
            [
                "turn",
                "session tokens",
                "Salience bytes sent",
                "completions bytes sent",
                "Salience TTFT ms",
                "completions TTFT ms",
            ],
            [
                [
                    row["turn"],
                    row["session_tokens"],
                    row["salience_bytes"],
                    row["completions_bytes"],
                    f"{row['salience_ttft_ms']:.1f}",
                    f"{row['completions_ttft_ms']:.1f}",
                ]
                for row in rows
                if row["turn"] == 1 or row["turn"] % 5 == 0
            ],
        ),
    ]
    figures = {"delta_tokens": DELTA, "decode_tokens": DECODE, "turns": rows}
    publish("salience", figures, "\n".join(lines), "salience_session.json")


if __name__ == "__main__":
    main()
