"""Anthropic Messages streaming against OpenAI chat streaming, on Switchboard and on `vllm
serve` (its own /v1/messages), in one run: output tok/s, TTFT p50 and the frontend's CPU
per output token. Issue 22's goals: Messages within 5% of chat on Switchboard, and ahead
of `vllm serve`'s Messages.

Workload (the protocols' of bench/clients.py): greedy, its fixed ~64-token `PROMPT` as one user
message, `OUTPUT_TOKENS` output tokens per request (the prompt's greedy continuation under
the chat template holds no EOS that early; Messages has no `ignore_eos`, so every run
checks every request's count: chat's usage, Messages' `message_delta` usage). C clients
at once (1 and 16) share a run's requests (`REQUESTS`), each on its own keep-alive
connection, one request after the other. The load is bench/sse_load.py's (a raw-bytes
child pinned to the engine's core at real-time priority: the aiohttp client floated onto
the frontend's core and decided whichever API it hit; each API's output is still checked
once per server with bench/clients.py's parsing client). The APIs take turns, `--pairs`
short runs each per round, and Messages' CPU per token over chat's is the median of the
ratios within turns. CPU: the server process's own user+sys (the engine core excluded),
per output token. One server alive at a time, rounds alternating which goes first;
medians over rounds; Switchboard against `vllm serve`: ratios of the medians of a round.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/messages_vs_chat.py \
        [--rounds 3] [--concurrency 1 16] [--pairs 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import harness
import sse_load
from clients import OUTPUT_TOKENS, PROMPT, Client, chat_sse, messages_sse
from harness import (
    Figures,
    Results,
    Round,
    Server,
    markdown_table,
    publish,
    ratios,
    run_rounds,
)


def _chat(port: int, c: int, n: int) -> sse_load.Spec:
    return sse_load.chat(port, "tiny", PROMPT, OUTPUT_TOKENS, c, n)


def _messages(port: int, c: int, n: int) -> sse_load.Spec:
    return sse_load.messages(port, "tiny", PROMPT, OUTPUT_TOKENS, c, n)


# Each API: the parsing client that checks its output once, and the load of its figures.
APIS: dict[str, tuple[Client, sse_load.Load]] = {
    "chat SSE": (chat_sse, _chat),
    "Messages SSE": (messages_sse, _messages),
}
TARGETS = ("switchboard", "vllm serve")
REQUESTS = {1: 16, 16: 96}  # per run (one turn of one API), by clients: ~1.5 s each
CPU = sse_load.CPU


def measure_start(args: argparse.Namespace) -> Any:
    def one_start(server: Server, round_: Round) -> Figures:
        return asyncio.run(
            sse_load.rows_round(server, APIS, args.concurrency, REQUESTS, args.pairs, round_.index)
        )

    return one_start


def table(results: Results, args: argparse.Namespace) -> str:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    rows = []
    for c in args.concurrency:
        for target in TARGETS:
            for name in APIS:
                rows.append(
                    [
                        c,
                        target,
                        name,
                        f"{med(results.per_round(target, name, c, 'output_tok_s')):.0f}",
                        f"{med(results.per_round(target, name, c, 'ttft_p50_ms')):.1f}",
                        f"{med(results.per_round(target, name, c, CPU)):.0f}",
                    ]
                )
        ours, theirs = ("switchboard", "Messages SSE", c), ("vllm serve", "Messages SSE", c)

        def vs_chat(key: str, c: int = c) -> float:
            return med(
                ratios(
                    results.per_round("switchboard", "Messages SSE", c, key),
                    results.per_round("switchboard", "chat SSE", c, key),
                )
            )

        def vs_peer(key: str, ours: Any = ours, theirs: Any = theirs) -> float:
            return med(ratios(results.per_round(*ours, key), results.per_round(*theirs, key)))

        cpu_vs_chat = med(results.per_round(*ours, "cpu_vs_first"))  # within turns
        rows.append(
            [
                c,
                "**ratios**",
                "Messages / chat on Switchboard; Switchboard / vllm serve on Messages",
                f"**{vs_chat('output_tok_s'):.2f}x; {vs_peer('output_tok_s'):.2f}x**",
                f"{vs_chat('ttft_p50_ms'):.2f}x; {vs_peer('ttft_p50_ms'):.2f}x",
                f"**{cpu_vs_chat:.2f}x; {vs_peer(CPU):.2f}x**",
            ]
        )
    return "\n".join(
        [
            "Tiny model, bench/clients.py's ~64-token prompt as a user message, "
            f"{OUTPUT_TOKENS} greedy output tokens per request (checked), "
            f"load: bench/sse_load.py on the engine's core, per run {REQUESTS} requests (by "
            f"clients) shared by the clients; each API {args.pairs} runs per round in turns, "
            "Messages' CPU vs chat the median of the ratios within turns; medians of "
            f"{args.rounds} alternating round(s). CPU: the server process's own user+sys (the "
            "frontend; the engine core excluded) per output token.",
            "",
            *markdown_table(
                [
                    "clients",
                    "server",
                    "API",
                    "output tok/s",
                    "TTFT p50 ms",
                    "frontend CPU us/tok",
                ],
                rows,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--pairs", type=int, default=8, help="turns of the APIs per round")
    args = parser.parse_args()
    harness.tiny_model()
    targets = [harness.switchboard("switchboard"), harness.vllm_serve("vllm serve")]
    results = run_rounds(targets, measure_start(args), rounds=args.rounds, name="messages")
    figures = {
        "output_tokens": OUTPUT_TOKENS,
        "requests_per_run": REQUESTS,
        "pairs": args.pairs,
        **results.record(),
    }
    publish("messages", figures, table(results, args))


if __name__ == "__main__":
    main()
