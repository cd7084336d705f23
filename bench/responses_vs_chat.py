"""The Responses API's streaming against chat streaming on one server, and against `vllm
serve`'s Responses API in the same run. Goal (issue 21): Switchboard's Responses within 5%
of its chat, and ahead of `vllm serve`'s Responses.

Workload: greedy, `ignore_eos`, one fixed ~64-token user message, `OUTPUT_TOKENS` output
tokens per request (every request's count is checked from its usage), C clients at once
(1 and 16) sharing a run's requests (`REQUESTS`), each client on one keep-alive
connection of its own. The load is bench/sse_load.py's: a child pinned to the engine's
core at real-time priority that reads raw bytes, so it never shares the frontend's core
(the aiohttp clients did, and which row of a round they hit decided the round). Each
row's output is checked once per server with bench/clients.py's parsing client. Rows per
server: chat SSE, Responses SSE with `store: false`, and on Switchboard Responses SSE
stored (OpenAI's default: one store write per response, to the SQLite file under a
temporary directory). `vllm serve` runs with its store off (its default), so its
Responses row is unstored.

Per row: output tok/s, TTFT p50 and the frontend's CPU per output token (the server
process's own user+sys; the engine core excluded). Within a server the rows take turns,
`--pairs` short runs each (rotating which goes first), and each row's CPU per token is
divided by chat's of the same turn: a 2-core VM's speed drifts by tens of percent over
seconds, the same for rows that run back to back, so the median of those ratios holds
where ratios of whole-run figures did not. Switchboard's Responses against `vllm
serve`'s is a ratio of medians (the servers run minutes apart). One server alive at a
time; rounds alternate which goes first.
Writes bench/results/responses.json and the table in docs/benchmarks.md between
`bench:responses`.

    .venv/bin/python bench/responses_vs_chat.py [--rounds 3] [--concurrency 1 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import sse_load
from clients import Client, Server, chat_sse, responses_sse
from common import markdown_table, publish, start_server, stop_server
from openai_vs_vllm import server_command
from protocols_cpu import OUTPUT_TOKENS, PROMPT, Metrics, measure, median_of

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _chat(port: int, c: int, n: int) -> sse_load.Spec:
    return sse_load.chat(port, "tiny", PROMPT, OUTPUT_TOKENS, c, n)


def _responses(store: bool) -> sse_load.Load:
    def load(port: int, c: int, n: int) -> sse_load.Spec:
        return sse_load.responses(port, "tiny", PROMPT, OUTPUT_TOKENS, c, n, store=store)

    return load


# Each row: the parsing client that checks its output once, and the load of its figures.
SWITCHBOARD: dict[str, tuple[Client, sse_load.Load]] = {
    "chat SSE": (chat_sse, _chat),
    "Responses SSE": (responses_sse(store=False), _responses(False)),
    "Responses SSE, stored": (responses_sse(store=True), _responses(True)),
}
PEER = {name: SWITCHBOARD[name] for name in ("chat SSE", "Responses SSE")}
TARGETS = {"switchboard": SWITCHBOARD, "vllm serve": PEER}
CPU = sse_load.CPU
REQUESTS = {1: 16, 16: 96}  # per run (one turn of one row), by clients: ~1.5 s each


def _command(target: str, port: int, state: Path) -> list[str]:
    command = server_command(target, port)
    if target == "switchboard":
        command += ["--grpc-port", "0", "--responses-store", str(state / "responses.sqlite3")]
    return command


async def serve_round(
    target: str, server: Server, pid: int, args: argparse.Namespace, round_: int
) -> dict[str, dict[int, Metrics]]:
    """Every row's figures at every concurrency, the rows taking turns
    (`sse_load.take_turns`: `args.pairs` runs each, chat first in the rows)."""
    rows = TARGETS[target]
    prompt = (PROMPT, [])
    for name, (client, _) in rows.items():  # warm each path, and check its output
        _, runs = await measure(client, server, prompt, 1, 1, pid)
        _check(name, runs[0].tokens, 1)
    loads = {name: load for name, (_, load) in rows.items()}
    out: dict[str, dict[int, Metrics]] = {name: {} for name in rows}
    for c in args.concurrency:
        requests = REQUESTS.get(c, 96)
        figures = sse_load.take_turns(loads, server.port, pid, c, requests, args.pairs, round_)
        for name, m in figures.items():
            m["cpu_vs_chat"] = m.pop("cpu_vs_first")
            out[name][c] = m
            print(
                f"round {round_} {target} c={c} {name}: {m['output_tok_s']:.0f} tok/s, "
                f"{m[CPU]:.0f} us/tok, {m['cpu_vs_chat']:.2f}x chat",
                file=sys.stderr,
                flush=True,
            )
    return out


def _check(name: str, tokens: int, requests: int) -> None:
    if tokens != requests * OUTPUT_TOKENS:
        raise AssertionError(f"{name}: {tokens} tokens from {requests} requests")


def ratios(round_: dict[str, dict[str, dict[int, Metrics]]]) -> None:
    for rows in round_.values():
        for by_c in rows.values():
            for c, m in by_c.items():
                m["tok_s_vs_chat"] = m["output_tok_s"] / rows["chat SSE"][c]["output_tok_s"]
                peer = round_["vllm serve"]["Responses SSE"][c]
                m["cpu_vs_vllm_responses"] = m[CPU] / peer[CPU]
                m["tok_s_vs_vllm_responses"] = m["output_tok_s"] / peer["output_tok_s"]


def table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for c in args.concurrency:
        for target, by_name in summary.items():
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
    parser.add_argument("--port", type=int, default=8131)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    server = Server(args.port)
    raw: list[dict[str, dict[str, dict[int, Metrics]]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as state:
        for r in range(args.rounds):
            targets = list(TARGETS) if r % 2 == 0 else list(reversed(TARGETS))
            round_: dict[str, dict[str, dict[int, Metrics]]] = {}
            for target in targets:
                log = RESULTS / f"responses-{target.replace(' ', '-')}-{r}.log"
                proc = start_server(_command(target, server.port, Path(state)), server.port, log)
                try:
                    round_[target] = asyncio.run(serve_round(target, server, proc.pid, args, r))
                finally:
                    stop_server(proc)
            ratios(round_)
            raw.append({t: round_[t] for t in TARGETS})
    summary = median_of(raw)
    figures = {
        "rounds": args.rounds,
        "output_tokens": OUTPUT_TOKENS,
        "requests_per_run": REQUESTS,
        "pairs": args.pairs,
        "median": summary,
        "raw": raw,
    }
    publish("responses", "responses.json", figures, table(summary, args))


if __name__ == "__main__":
    main()
