"""Anthropic Messages streaming against OpenAI chat streaming, on Switchboard and on `vllm
serve` (its own /v1/messages), in one run: output tok/s, TTFT p50 and the frontend's CPU
per output token. Issue 22's goals: Messages within 5% of chat on Switchboard, and ahead
of `vllm serve`'s Messages.

Workload (bench/protocols_cpu.py's): greedy, its fixed ~64-token `PROMPT` as one user
message, `OUTPUT_TOKENS` output tokens per request (the prompt's greedy continuation under
the chat template holds no EOS that early; Messages has no `ignore_eos`, so every run
checks every request's count: chat's usage, Messages' `message_delta` usage). C clients
at once (1 and 16) share `--requests` requests, each on its own connection, one request
after the other; the load client is aiohttp reading SSE lines (the SDKs would cost the
shared cores more than the servers). CPU: the server process's own user+sys (the engine
core excluded), per output token. One server alive at a time, rounds alternating which
goes first and which API runs first; medians over rounds, ratios within each round.

    .venv/bin/python bench/messages_vs_chat.py [--rounds 3] [--concurrency 1 16] [--requests 96]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import protocols_cpu
from clients import Client, Prompt, Server, chat_sse, messages_sse
from common import markdown_table, publish, start_server, stop_server
from openai_vs_vllm import MODEL, server_command
from protocols_cpu import OUTPUT_TOKENS, PROMPT

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
Metrics = dict[str, float]


APIS: dict[str, Client] = {"Messages SSE": messages_sse, "chat SSE": chat_sse}
TARGETS = ("switchboard", "vllm serve")


async def measure(
    client: Client, server: Server, prompt: Prompt, clients: int, requests: int, pid: int
) -> Metrics:
    metrics, runs = await protocols_cpu.measure(client, server, prompt, clients, requests, pid)
    expected = clients * requests * OUTPUT_TOKENS
    got = sum(run.tokens for run in runs)
    if got != expected:
        raise AssertionError(f"{got} output tokens where {expected} were due (an EOS?)")
    return metrics


async def serve_round(
    server: Server, pid: int, args: argparse.Namespace, round_: int, target: str
) -> dict[str, dict[int, Metrics]]:
    prompt: Prompt = (PROMPT, [])
    names = list(APIS) if round_ % 2 == 0 else list(reversed(APIS))
    for name in names:  # warm each path; the first request of a fresh engine pays its warm-up
        await measure(APIS[name], server, prompt, 1, 1, pid)
    await protocols_cpu.warm_batches(APIS[names[0]], server, prompt, args.concurrency, pid)
    out: dict[str, dict[int, Metrics]] = {name: {} for name in APIS}
    for c in args.concurrency:
        for name in names:
            metrics = await measure(APIS[name], server, prompt, c, max(1, args.requests // c), pid)
            out[name][c] = metrics
            print(
                f"round {round_} {target} c={c} {name}: {metrics['output_tok_s']:.0f} tok/s, "
                f"{metrics['frontend_cpu_us_per_tok']:.0f} us/tok",
                file=sys.stderr,
                flush=True,
            )
    return out


def table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for c in args.concurrency:
        for target in TARGETS:
            for name in APIS:
                m = summary["servers"][target][name][c]
                rows.append(
                    [
                        c,
                        target,
                        name,
                        f"{m['output_tok_s']:.0f}",
                        f"{m['ttft_p50_ms']:.1f}",
                        f"{m['frontend_cpu_us_per_tok']:.0f}",
                    ]
                )
        r = summary["ratios"][c]
        rows.append(
            [
                c,
                "**ratios**",
                "Messages / chat on Switchboard; Switchboard / vllm serve on Messages",
                f"**{r['messages_vs_chat_tok_s']:.2f}x; {r['vs_vllm_tok_s']:.2f}x**",
                f"{r['messages_vs_chat_ttft']:.2f}x; {r['vs_vllm_ttft']:.2f}x",
                f"**{r['messages_vs_chat_cpu']:.2f}x; {r['vs_vllm_cpu']:.2f}x**",
            ]
        )
    return "\n".join(
        [
            "Tiny model, bench/protocols_cpu.py's ~64-token prompt as a user message, "
            f"{OUTPUT_TOKENS} greedy output tokens per request (checked), "
            f"{args.requests} requests per run shared by its clients; medians of "
            f"{args.rounds} alternating round(s), ratios taken within each round. CPU: the "
            "server process's own user+sys (the frontend; the engine core excluded) per "
            "output token.",
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


def _ratios(round_: dict[str, dict[str, dict[int, Metrics]]], c: int) -> Metrics:
    ours, peer = round_["switchboard"], round_["vllm serve"]
    m, chat, theirs = ours["Messages SSE"][c], ours["chat SSE"][c], peer["Messages SSE"][c]
    return {
        "messages_vs_chat_tok_s": m["output_tok_s"] / chat["output_tok_s"],
        "messages_vs_chat_ttft": m["ttft_p50_ms"] / chat["ttft_p50_ms"],
        "messages_vs_chat_cpu": m["frontend_cpu_us_per_tok"] / chat["frontend_cpu_us_per_tok"],
        "vs_vllm_tok_s": m["output_tok_s"] / theirs["output_tok_s"],
        "vs_vllm_ttft": m["ttft_p50_ms"] / theirs["ttft_p50_ms"],
        "vs_vllm_cpu": m["frontend_cpu_us_per_tok"] / theirs["frontend_cpu_us_per_tok"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--port", type=int, default=8129)
    args = parser.parse_args()
    if not (MODEL / "config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "app.cli", "make-tiny-model", str(MODEL)], check=True, cwd=ROOT
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    server = Server(args.port)
    raw = []
    for r in range(args.rounds):
        round_: dict[str, dict[str, dict[int, Metrics]]] = {}
        for target in TARGETS if r % 2 == 0 else tuple(reversed(TARGETS)):
            log = RESULTS / f"messages-{target.replace(' ', '-')}-{r}.log"
            command = server_command(target, server.port)
            if target == "switchboard":
                command += ["--grpc-port", "0"]
            proc = start_server(command, server.port, log)
            try:
                round_[target] = asyncio.run(serve_round(server, proc.pid, args, r, target))
            finally:
                stop_server(proc)
        raw.append({"servers": round_, "ratios": {c: _ratios(round_, c) for c in args.concurrency}})
    summary = {
        "servers": {
            t: {
                n: {
                    c: {
                        k: statistics.median(x["servers"][t][n][c][k] for x in raw)
                        for k in raw[0]["servers"][t][n][c]
                    }
                    for c in args.concurrency
                }
                for n in APIS
            }
            for t in TARGETS
        },
        "ratios": {
            c: {k: statistics.median(x["ratios"][c][k] for x in raw) for k in raw[0]["ratios"][c]}
            for c in args.concurrency
        },
    }
    figures = {
        "rounds": args.rounds,
        "output_tokens": OUTPUT_TOKENS,
        "requests_per_run": args.requests,
        "median": summary,
        "raw": raw,
    }
    publish("messages", "messages.json", figures, table(summary, args))


if __name__ == "__main__":
    main()
