"""The Responses API's streaming against chat streaming on one server, and against `vllm
serve`'s Responses API in the same run. Goal (issue 21): Switchboard's Responses within 5%
of its chat, and ahead of `vllm serve`'s Responses.

Workload: greedy, `ignore_eos`, one fixed ~64-token user message, `OUTPUT_TOKENS` output
tokens per request (every request's count is checked from its usage), C clients at once
(1 and 16) sharing `--requests` requests, each client on one connection of its own
(bench/clients.py). Rows per server: chat SSE, Responses SSE with `store: false`, and on
Switchboard Responses SSE stored (OpenAI's default: one store write per response, to
the SQLite file under a temporary directory). `vllm serve` runs with its store off (its
default), so its Responses row is unstored.

Per row: output tok/s, TTFT p50 and the frontend's CPU per output token (the server
process's own user+sys; the engine core excluded), with the ratio of each row's CPU per
token to the same server's chat within each round, and of Switchboard's Responses to
`vllm serve`'s Responses. One server alive at a time; rounds alternate which goes first.
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

from clients import Client, Server, chat_sse, responses_sse
from common import markdown_table, publish, start_server, stop_server
from openai_vs_vllm import server_command
from protocols_cpu import OUTPUT_TOKENS, PROMPT, Metrics, measure, median_of, warm_batches

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SWITCHBOARD: dict[str, Client] = {
    "chat SSE": chat_sse,
    "Responses SSE": responses_sse(store=False),
    "Responses SSE, stored": responses_sse(store=True),
}
PEER: dict[str, Client] = {"chat SSE": chat_sse, "Responses SSE": responses_sse(store=False)}
TARGETS = {"switchboard": SWITCHBOARD, "vllm serve": PEER}
CPU = "frontend_cpu_us_per_tok"


def _command(target: str, port: int, state: Path) -> list[str]:
    command = server_command(target, port)
    if target == "switchboard":
        command += ["--grpc-port", "0", "--responses-store", str(state / "responses.sqlite3")]
    return command


async def serve_round(
    target: str, server: Server, pid: int, args: argparse.Namespace, round_: int
) -> dict[str, dict[int, Metrics]]:
    rows = TARGETS[target]
    prompt = (PROMPT, [])
    for name, client in rows.items():  # warm each path, and check the workload
        _, runs = await measure(client, server, prompt, 1, 1, pid)
        _check(name, runs[0].tokens, 1)
    await warm_batches(rows["chat SSE"], server, prompt, args.concurrency, pid)
    order = list(rows)[round_ % len(rows) :] + list(rows)[: round_ % len(rows)]
    out: dict[str, dict[int, Metrics]] = {name: {} for name in rows}
    for c in args.concurrency:
        for name in order:
            each = max(1, args.requests // c)
            metrics, runs = await measure(rows[name], server, prompt, c, each, pid)
            _check(name, sum(run.tokens for run in runs), c * each)
            out[name][c] = metrics
            print(
                f"round {round_} {target} c={c} {name}: {metrics['output_tok_s']:.0f} tok/s, "
                f"{metrics[CPU]:.0f} us/tok",
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
                m["cpu_vs_chat"] = m[CPU] / rows["chat SSE"][c][CPU]
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
            f"per request (ignore_eos, checked), {args.requests} requests per run shared by its "
            f"clients; medians of {args.rounds} alternating round(s), ratios taken within each "
            "round. CPU: the server process's own user+sys per output token.",
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
    parser.add_argument("--requests", type=int, default=96)
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
        "requests_per_run": args.requests,
        "median": summary,
        "raw": raw,
    }
    publish("responses", "responses.json", figures, table(summary, args))


if __name__ == "__main__":
    main()
