"""Evergreen GENERATE vs OpenAI chat streaming, on one server (one engine).

Two measurements, each alternating the two protocols over rounds, medians reported:

1. Throughput: C clients at once, each running R greedy generations of 64 tokens one after
   the other. An Evergreen client keeps one session (binary frames) and sends a GENERATE
   with a fresh prompt node per request; a chat client streams /v1/chat/completions
   (SSE). Both get the same prompts, so the same outputs (checked): the ratio of their
   wall times is the cost of the protocol, node fragments vs SSE chunks.
2. A conversation grown turn by turn: each turn asks a 400-character question and
   decodes 16 tokens. The Evergreen client sends only the new question and an action
   whose prompt node names the previous prompt and response; the chat client resends
   the whole conversation. Per turn: bytes sent, and time to the first output text.

Writes bench/results/evergreen.json and the table between the
`bench:evergreen` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/evergreen_vs_chat.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import aiohttp
import harness
import websockets
from clients import (
    chat_body,
    evergreen_action,
    evergreen_leaf,
    evergreen_output,
    openai_stream,
)
from harness import markdown_table, publish

from schemas import evergreen_service_pb2 as service_pb

PORT = harness.PORT
OUTPUT_TOKENS = 64
REQUESTS_PER_CLIENT = 4
TURN_DECODE = 16
QUESTION = "Explain, with care and in order, what the following Python function does: " * 5


async def _evergreen_request(ws: Any, message: Any, output: str) -> tuple[str, float, int]:
    """(output text, seconds to its first fragment, bytes sent)."""
    frame = message.SerializeToString()
    start = time.perf_counter()
    await ws.send(frame)

    async def receive() -> Any:
        return service_pb.SessionMessage.FromString(await ws.recv())

    text, ttft, _ = await evergreen_output(receive, output, start)
    return text.decode(), ttft, len(frame)


async def _chat_request(
    client: aiohttp.ClientSession, messages: list[dict[str, str]], max_tokens: int
) -> tuple[str, float, int, int]:
    """(output text, seconds to its first text, bytes sent, output tokens)."""
    body = chat_body("tiny", messages, max_tokens)
    return await openai_stream(client, "/v1/chat/completions", body)


def _prompt(client: int, request: int, round_: int) -> str:
    return f"Story {round_}.{client}.{request}: once upon a time, in a land of code,"


async def _throughput_evergreen(
    clients: int, round_: int
) -> tuple[float, list[float], dict[str, str]]:
    outputs: dict[str, str] = {}
    ttfts: list[float] = []

    async def one(c: int) -> None:
        async with websockets.connect(f"ws://127.0.0.1:{PORT}/evergreen/ws", max_size=None) as ws:
            for r in range(REQUESTS_PER_CLIENT):
                message = service_pb.SessionMessage()
                message.actions.append(evergreen_action(f"p{r}", f"r{r}", OUTPUT_TOKENS))
                evergreen_leaf(message, f"p{r}", _prompt(c, r, round_))
                text, ttft, _ = await _evergreen_request(ws, message, f"r{r}")
                outputs[_prompt(c, r, round_)] = text
                ttfts.append(ttft)

    start = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(clients)))
    return time.perf_counter() - start, ttfts, outputs


async def _throughput_chat(
    clients: int, round_: int
) -> tuple[float, list[float], dict[str, str], int]:
    outputs: dict[str, str] = {}
    ttfts: list[float] = []
    tokens = 0

    async def one(c: int, client: aiohttp.ClientSession) -> None:
        nonlocal tokens
        for r in range(REQUESTS_PER_CLIENT):
            prompt = _prompt(c, r, round_)
            messages = [{"role": "user", "content": prompt}]
            text, ttft, _, n = await _chat_request(client, messages, OUTPUT_TOKENS)
            outputs[prompt] = text
            ttfts.append(ttft)
            tokens += n

    async with _chat_client() as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(c, client) for c in range(clients)))
        return time.perf_counter() - start, ttfts, outputs, tokens


def _chat_client() -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=300)
    return aiohttp.ClientSession(base_url=f"http://127.0.0.1:{PORT}", timeout=timeout)


async def throughput(clients: int, rounds: int) -> dict[str, Any]:
    rows: dict[str, list[float]] = {"evergreen_s": [], "chat_s": [], "eg_ttft": [], "chat_ttft": []}
    tokens = 0
    for round_ in range(rounds):
        # Alternate which protocol goes first: the machine's load drifts.
        order = ["evergreen", "chat"] if round_ % 2 == 0 else ["chat", "evergreen"]
        results: dict[str, Any] = {}
        for name in order:
            if name == "evergreen":
                results[name] = await _throughput_evergreen(clients, round_)
            else:
                results[name] = await _throughput_chat(clients, round_)
        eg_wall, eg_ttfts, eg_out = results["evergreen"]
        chat_wall, chat_ttfts, chat_out, tokens = results["chat"]
        if eg_out != chat_out:
            raise AssertionError("Evergreen and chat generated different texts")
        rows["evergreen_s"].append(eg_wall)
        rows["chat_s"].append(chat_wall)
        rows["eg_ttft"].append(statistics.median(eg_ttfts))
        rows["chat_ttft"].append(statistics.median(chat_ttfts))
    eg, chat = statistics.median(rows["evergreen_s"]), statistics.median(rows["chat_s"])
    return {
        "clients": clients,
        "output_tokens": tokens,
        "evergreen_tok_s": tokens / eg,
        "chat_tok_s": tokens / chat,
        "ratio": chat / eg,
        "evergreen_ttft_ms": statistics.median(rows["eg_ttft"]) * 1000,
        "chat_ttft_ms": statistics.median(rows["chat_ttft"]) * 1000,
        "rounds": rows,
    }


async def conversation(turns: int) -> list[dict[str, Any]]:
    rows = []
    messages: list[dict[str, str]] = []
    async with (
        _chat_client() as client,
        websockets.connect(f"ws://127.0.0.1:{PORT}/evergreen/ws", max_size=None) as ws,
    ):
        for turn in range(1, turns + 1):
            question = f"Turn {turn}. {QUESTION}"
            message = service_pb.SessionMessage()
            message.actions.append(evergreen_action(f"p{turn}", f"r{turn}", TURN_DECODE))
            children = [f"p{turn - 1}", f"r{turn - 1}"] if turn > 1 else []
            message.node_fragments.add(id=f"p{turn}", child_ids=[*children, f"q{turn}"])
            evergreen_leaf(message, f"q{turn}", question)
            text, eg_ttft, eg_bytes = await _evergreen_request(ws, message, f"r{turn}")
            messages.append({"role": "user", "content": question})
            chat_text, chat_ttft, chat_bytes, _ = await _chat_request(client, messages, TURN_DECODE)
            if chat_text != text:
                raise AssertionError(f"turn {turn}: the two protocols answered differently")
            messages.append({"role": "assistant", "content": text})
            rows.append(
                {
                    "turn": turn,
                    "evergreen_bytes": eg_bytes,
                    "chat_bytes": chat_bytes,
                    "evergreen_ttft_ms": eg_ttft * 1000,
                    "chat_ttft_ms": chat_ttft * 1000,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    target = harness.switchboard("switchboard", long=True)
    with harness.started(target):
        streams = [asyncio.run(throughput(c, args.rounds)) for c in (1, 8)]
        turns = asyncio.run(conversation(args.turns))
    lines = [
        f"Greedy generations of {OUTPUT_TOKENS} tokens, {REQUESTS_PER_CLIENT} per client in "
        f"a row; one server, tiny model; medians of {args.rounds} alternating rounds.",
        "",
        *markdown_table(
            [
                "clients",
                "Evergreen tok/s",
                "chat SSE tok/s",
                "Evergreen vs chat",
                "Evergreen TTFT ms",
                "chat TTFT ms",
            ],
            [
                [
                    row["clients"],
                    f"{row['evergreen_tok_s']:.0f}",
                    f"{row['chat_tok_s']:.0f}",
                    f"{row['ratio']:.2f}x",
                    f"{row['evergreen_ttft_ms']:.1f}",
                    f"{row['chat_ttft_ms']:.1f}",
                ]
                for row in streams
            ],
        ),
        "",
        f"A conversation: each turn asks {len(QUESTION) + 9}-odd characters and decodes "
        f"{TURN_DECODE} tokens.",
        "",
        *markdown_table(
            [
                "turn",
                "Evergreen bytes sent",
                "chat bytes sent",
                "Evergreen TTFT ms",
                "chat TTFT ms",
            ],
            [
                [
                    row["turn"],
                    row["evergreen_bytes"],
                    row["chat_bytes"],
                    f"{row['evergreen_ttft_ms']:.1f}",
                    f"{row['chat_ttft_ms']:.1f}",
                ]
                for row in turns
                if row["turn"] == 1 or row["turn"] % 5 == 0
            ],
        ),
    ]
    publish("evergreen", {"throughput": streams, "conversation": turns}, "\n".join(lines))


if __name__ == "__main__":
    main()
