"""Anthropic Messages streaming against OpenAI chat streaming, on Switchboard and on `vllm
serve` (its own /v1/messages), in one run: output tok/s, TTFT p50 and the frontend's CPU
per output token. Issue 22's goals: Messages within 5% of chat on Switchboard, and ahead
of `vllm serve`'s Messages.

Workload (bench/protocols_cpu.py's): greedy, its fixed ~64-token `PROMPT` as one user
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

    .venv/bin/python bench/messages_vs_chat.py [--rounds 3] [--concurrency 1 16] [--pairs 8]
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
import sse_load
from clients import Client, Prompt, Server, chat_sse, messages_sse
from common import markdown_table, publish, start_server, stop_server
from openai_vs_vllm import MODEL, server_command
from protocols_cpu import OUTPUT_TOKENS, PROMPT

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
Metrics = dict[str, float]


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


async def serve_round(
    server: Server, pid: int, args: argparse.Namespace, round_: int, target: str
) -> dict[str, dict[int, Metrics]]:
    """Both APIs' figures at every concurrency, taking turns (`sse_load.take_turns`:
    `args.pairs` runs each; `cpu_vs_chat`, Messages' CPU per token over chat's within
    turns)."""
    prompt: Prompt = (PROMPT, [])
    for name, (client, _) in APIS.items():  # warm each path, and check its token counts
        _, runs = await protocols_cpu.measure(client, server, prompt, 1, 1, pid)
        if runs[0].tokens != OUTPUT_TOKENS:
            raise AssertionError(f"{name}: {runs[0].tokens} output tokens (an EOS?)")
    loads = {name: load for name, (_, load) in APIS.items()}
    out: dict[str, dict[int, Metrics]] = {name: {} for name in APIS}
    for c in args.concurrency:
        requests = REQUESTS.get(c, 96)
        figures = sse_load.take_turns(loads, server.port, pid, c, requests, args.pairs, round_)
        for name, m in figures.items():
            m["cpu_vs_chat"] = m.pop("cpu_vs_first")
            out[name][c] = m
            print(
                f"round {round_} {target} c={c} {name}: {m['output_tok_s']:.0f} tok/s, "
                f"{m['frontend_cpu_us_per_tok']:.0f} us/tok, {m['cpu_vs_chat']:.2f}x chat",
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


def _ratios(round_: dict[str, dict[str, dict[int, Metrics]]], c: int) -> Metrics:
    ours, peer = round_["switchboard"], round_["vllm serve"]
    m, chat, theirs = ours["Messages SSE"][c], ours["chat SSE"][c], peer["Messages SSE"][c]
    return {
        "messages_vs_chat_tok_s": m["output_tok_s"] / chat["output_tok_s"],
        "messages_vs_chat_ttft": m["ttft_p50_ms"] / chat["ttft_p50_ms"],
        "messages_vs_chat_cpu": m["cpu_vs_chat"],  # within turns
        "vs_vllm_tok_s": m["output_tok_s"] / theirs["output_tok_s"],
        "vs_vllm_ttft": m["ttft_p50_ms"] / theirs["ttft_p50_ms"],
        "vs_vllm_cpu": m["frontend_cpu_us_per_tok"] / theirs["frontend_cpu_us_per_tok"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--pairs", type=int, default=8, help="turns of the APIs per round")
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
        "requests_per_run": REQUESTS,
        "pairs": args.pairs,
        "median": summary,
        "raw": raw,
    }
    publish("messages", "messages.json", figures, table(summary, args))


if __name__ == "__main__":
    main()
