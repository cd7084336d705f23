"""The Responses API's streaming against chat streaming on one server, and against `vllm
serve`'s Responses API in the same run. Goal (issues 21 and 31): Switchboard's Responses
within 5% of its chat's frontend CPU per token, over SSE and over its websocket mode, and
ahead of `vllm serve`'s Responses.

Workload: greedy, `ignore_eos`, one fixed ~64-token user message, `OUTPUT_TOKENS` output
tokens per request (every request's count is checked from its usage), C clients at once
(1 and 16) sharing a run's requests (`REQUESTS`), each client on one keep-alive
connection of its own. The load is bench/sse_load.py's: a child pinned to the engine's
core at real-time priority that reads raw bytes, so it never shares the frontend's core
(the aiohttp clients did, and which row of a round they hit decided the round). Each
row's output is checked once per server with bench/clients.py's parsing client. Rows per
server: chat SSE, Responses SSE with `store: false`, and on Switchboard Responses SSE
stored (OpenAI's default: one store write per response, to the SQLite file under a
temporary directory) and the Responses API's websocket mode (`store: false`, each client
one websocket carrying its requests one after the other; `vllm serve` 0.32 has no
websocket mode). `vllm serve` runs with its store off (its default), so its
Responses row is unstored.

Per row: output tok/s, TTFT p50 and the frontend's CPU per output token (the server
process's own user+sys; the engine core excluded). Within a server the rows take turns,
`--pairs` short runs each (rotating which goes first), and each row's CPU per token is
divided by chat's of the same turn: a 2-core VM's speed drifts by tens of percent over
seconds, the same for rows that run back to back, so the median of those ratios holds
where ratios of whole-run figures did not. Switchboard's Responses against `vllm
serve`'s is a ratio of medians (the servers run minutes apart). One server alive at a
time; rounds alternate which goes first.
Writes bench/results/responses.json and the table between
`bench:responses`.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/responses_vs_chat.py \
        [--rounds 3] [--concurrency 1 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

import harness
import sse_load
from clients import OUTPUT_TOKENS, PROMPT, Client, chat_sse, responses_sse, responses_ws
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


def _responses_ws(port: int, c: int, n: int) -> sse_load.Spec:
    return sse_load.responses_ws(port, "tiny", PROMPT, OUTPUT_TOKENS, c, n)


def _responses(store: bool) -> sse_load.Load:
    def load(port: int, c: int, n: int) -> sse_load.Spec:
        return sse_load.responses(port, "tiny", PROMPT, OUTPUT_TOKENS, c, n, store=store)

    return load


# Each row: the parsing client that checks its output once, and the load of its figures.
SWITCHBOARD: dict[str, tuple[Client, sse_load.Load]] = {
    "chat SSE": (chat_sse, _chat),
    "Responses SSE": (responses_sse(store=False), _responses(False)),
    "Responses SSE, stored": (responses_sse(store=True), _responses(True)),
    "Responses WebSocket": (responses_ws, _responses_ws),
}
PEER = {name: SWITCHBOARD[name] for name in ("chat SSE", "Responses SSE")}
ROWS = {"switchboard": SWITCHBOARD, "vllm serve": PEER}
CPU = sse_load.CPU
REQUESTS = {1: 16, 16: 96}  # per run (one turn of one row), by clients: ~1.5 s each


def measure_start(args: argparse.Namespace) -> Any:
    def one_start(server: Server, round_: Round) -> Figures:
        rows = ROWS[server.target.name]
        return asyncio.run(
            sse_load.rows_round(server, rows, args.concurrency, REQUESTS, args.pairs, round_.index)
        )

    return one_start


def summary(results: Results, args: argparse.Namespace) -> dict[str, Any]:
    """Each row's medians over rounds, with its CPU over its server's chat (within turns)
    and its CPU and tok/s over `vllm serve`'s Responses row (within rounds)."""
    out: dict[str, Any] = {}
    for target, rows in ROWS.items():
        for name in rows:
            for c in args.concurrency:
                keys = results.raw[target][0][0][name][c]
                m = {k: statistics.median(results.per_round(target, name, c, k)) for k in keys}
                m["cpu_vs_chat"] = m.pop("cpu_vs_first")
                for key, label in ((CPU, "cpu"), ("output_tok_s", "tok_s")):
                    mine = results.per_round(target, name, c, key)
                    peer = results.per_round("vllm serve", "Responses SSE", c, key)
                    m[f"{label}_vs_vllm_responses"] = statistics.median(ratios(mine, peer))
                out.setdefault(target, {}).setdefault(name, {})[c] = m
    return out


def table(medians: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for c in args.concurrency:
        for target, by_name in medians.items():
            for name, by_c in by_name.items():
                m = by_c[c]
                rows.append(
                    [
                        c,
                        target,
                        name,
                        f"{m['output_tok_s']:.0f}",
                        f"{m['ttft_p50_ms']:.1f}",
                        f"{m[CPU]:.0f}",
                        f"{m['cpu_vs_chat']:.2f}x",
                        f"{m['cpu_vs_vllm_responses']:.2f}x",
                        f"{m['tok_s_vs_vllm_responses']:.2f}x",
                    ]
                )
    return "\n".join(
        [
            f"Tiny model, one fixed ~64-token user message, {OUTPUT_TOKENS} greedy output tokens "
            f"per request (ignore_eos, checked); load: bench/sse_load.py on the engine's core; "
            f"per run {REQUESTS} requests (by clients) shared by the clients; each row "
            f"{args.pairs} runs per round in turns with the others, CPU vs chat the median of "
            f"the ratios within turns; medians of {args.rounds} alternating round(s). CPU: the "
            "server process's own user+sys per output token.",
            "",
            *markdown_table(
                [
                    "clients",
                    "server",
                    "stream",
                    "output tok/s",
                    "TTFT p50 ms",
                    "frontend CPU us/tok",
                    "CPU vs its chat",
                    "CPU vs vllm serve Responses",
                    "tok/s vs vllm serve Responses",
                ],
                rows,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--pairs", type=int, default=8, help="turns of the rows per round")
    args = parser.parse_args()
    harness.tiny_model()
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as state:
        store = str(Path(state) / "responses.sqlite3")
        targets = [
            harness.switchboard("switchboard", "--responses-store", store),
            harness.vllm_serve("vllm serve"),
        ]
        results = run_rounds(targets, measure_start(args), rounds=args.rounds, name="responses")
    medians = summary(results, args)
    figures = {
        "output_tokens": OUTPUT_TOKENS,
        "requests_per_run": REQUESTS,
        "pairs": args.pairs,
        "median": medians,
        **results.record(),
    }
    publish("responses", figures, table(medians, args))


if __name__ == "__main__":
    main()
