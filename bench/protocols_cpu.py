"""Frontend CPU per output token over every way Switchboard serves tokens, on one server,
beside `vllm serve` on OpenAI: issue 15's goals are Switchboard <= 0.5x `vllm serve`'s CPU
per token on OpenAI, and each protocol within 10% of the cheapest.

Workload, the same on every protocol: greedy, one fixed prompt (`PROMPT`, ~64 tokens),
`OUTPUT_TOKENS` output tokens. C clients at once (`--concurrency`, 1 and 16) share
`--requests` requests, each client running its share one after the other on one
connection or session of its own (the clients in bench/clients.py): OpenAI completions
SSE, OpenAI chat SSE, GraphPipe (one request per call, one row), Evergreen and Salience
over the websocket and over gRPC, all on ONE Switchboard server; `vllm serve`
(completions and chat SSE) is the peer. Only the OpenAI routes take `ignore_eos`; the
prompt was chosen so that its greedy continuation holds no EOS within `OUTPUT_TOKENS`,
and every run checks that every request produced exactly that many tokens (OpenAI: usage;
GraphPipe and Salience: the token ids; Evergreen, which reports no count: its text equals
Switchboard's chat output for the same prompt, as both render it with the chat template).

Per protocol: output tok/s (the run's wall time), TTFT p50 (where the protocol streams;
GraphPipe does not), and the frontend CPU per output token: the server process's own
user+sys CPU over the run (`harness.Meter`: the engine's processes excluded), which is far
steadier than tok/s on a shared 2-core machine. Ratios of CPU per token to the
cheapest Switchboard protocol and to `vllm serve`'s completions SSE are taken within each
round, then their median over rounds is reported (the other figures are medians too).

One server alive at a time; rounds alternate which server goes first, and rotate the order
of the protocols within a server. Writes bench/results/protocols.json and the table in
docs/grpc.md between the `bench:protocols` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/protocols_cpu.py \
        [--rounds 3] [--concurrency 1 16] [--requests 96]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import harness
import httpx
from clients import (
    OUTPUT_TOKENS,
    PROMPT,
    Client,
    Prompt,
    Run,
    chat_sse,
    completions_sse,
    evergreen_grpc,
    evergreen_ws,
    graphpipe,
    measure,
    salience_grpc,
    salience_ws,
)
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

SWITCHBOARD: dict[str, Client] = {
    "OpenAI completions SSE": completions_sse,
    "OpenAI chat SSE": chat_sse,
    "GraphPipe": graphpipe,
    "Evergreen websocket": evergreen_ws,
    "Salience websocket": salience_ws,
    "Salience gRPC": salience_grpc,
    "Evergreen gRPC": evergreen_grpc,
}
PEER: dict[str, Client] = {name: SWITCHBOARD[name] for name in SWITCHBOARD if "OpenAI" in name}
PROTOCOLS: dict[str, dict[str, Client]] = {"switchboard": SWITCHBOARD, "vllm serve": PEER}
BASELINE = ("vllm serve", "OpenAI completions SSE")
CPU = "frontend_cpu_us_per_tok"


class Check:
    """What every request must have produced: `OUTPUT_TOKENS` tokens, and on Evergreen
    the text Switchboard's chat produced for the same prompt (`chat_text`)."""

    def __init__(self) -> None:
        self.chat_text: str | None = None

    def __call__(self, protocol: str, runs: list[Run], requests: int) -> None:
        outputs = [o for run in runs for o in run.outputs]
        if len(outputs) != requests:
            raise AssertionError(f"{protocol}: {len(outputs)} answers to {requests} requests")
        if protocol.startswith("Evergreen"):
            if self.chat_text is None:
                raise AssertionError("Evergreen is checked against chat, which has not run")
            wrong = [o for o in outputs if o != self.chat_text]
            if wrong:
                raise AssertionError(
                    f"{protocol}: {len(wrong)} of {requests} outputs differ from chat's "
                    f"{OUTPUT_TOKENS}-token output (an EOS, or another continuation): "
                    f"{wrong[0]!r} vs {self.chat_text!r}"
                )
            return
        tokens = sum(run.tokens for run in runs)
        counts = [len(o) for o in outputs] if not isinstance(outputs[0], str) else []
        if tokens != requests * OUTPUT_TOKENS or any(n != OUTPUT_TOKENS for n in counts):
            raise AssertionError(
                f"{protocol}: {tokens} tokens from {requests} requests, expected "
                f"{OUTPUT_TOKENS} each: the prompt's greedy continuation may hold an EOS "
                "(only OpenAI has ignore_eos); choose another PROMPT"
            )
        if protocol == "OpenAI chat SSE" and self.chat_text is None:
            self.chat_text = outputs[0]


def measure_start(args: argparse.Namespace) -> Any:
    def one_start(server: Server, round_: Round) -> Figures:
        # Salience takes token ids: the server's own tokenization of PROMPT.
        tokenized = httpx.post(
            f"{server.url}/tokenize", json={"model": server.model, "prompt": PROMPT}, timeout=60
        )
        prompt = (PROMPT, [int(t) for t in tokenized.json()["tokens"]])
        args.prompt_tokens = len(prompt[1])
        return asyncio.run(serve_round(server, prompt, args, round_))

    return one_start


async def warm_batches(
    client: Client, server: Server, prompt: Prompt, concurrency: Sequence[int]
) -> None:
    """One request per client at every concurrency measured: a fresh CPU engine's first
    batch of a size costs it 2-3x the next one's time (a 16-wide batch's first run read
    1,000-1,500 tok/s where the same server then gave 4,500-5,700), and whichever path a
    round measured first at that size took the blame."""
    for c in concurrency:
        await measure(client, server, prompt, c, 1)


async def serve_round(
    server: Server, prompt: Prompt, args: argparse.Namespace, round_: Round
) -> Figures:
    target = server.target.name
    protocols = list(PROTOCOLS[target])
    check = Check()
    # Warm every path once (a fresh engine's first request, each transport's first call)
    # and check the workload: every protocol produces OUTPUT_TOKENS tokens.
    for name in protocols:
        _, runs = await measure(PROTOCOLS[target][name], server, prompt, 1, 1)
        check(name, runs, 1)
    await warm_batches(PROTOCOLS[target][protocols[0]], server, prompt, args.concurrency)
    shift = round_.index % len(protocols)
    order = protocols[shift:] + protocols[:shift]
    out: Figures = {name: {} for name in protocols}
    for c in args.concurrency:
        for name in order:
            each = max(1, args.requests // c)
            metrics, runs = await measure(PROTOCOLS[target][name], server, prompt, c, each)
            check(name, runs, c * each)
            out[name][c] = metrics
            print(
                f"round {round_.index} {target} c={c} {name}: "
                f"{metrics['output_tok_s']:.0f} tok/s, {metrics[CPU]:.0f} us/tok",
                file=sys.stderr,
                flush=True,
            )
    return out


def summary(results: Results, args: argparse.Namespace) -> dict[str, Any]:
    """Medians over rounds of each row's figures, and of its CPU per token over the
    cheapest Switchboard protocol's and over `vllm serve` completions', within rounds."""
    out: dict[str, Any] = {}
    for target, protocols in PROTOCOLS.items():
        for name in protocols:
            for c in args.concurrency:
                keys = results.raw[target][0][0][name][c]
                m = {k: statistics.median(results.per_round(target, name, c, k)) for k in keys}
                peer = results.per_round(*BASELINE, c, CPU)
                cheapest = [
                    min(by_round)
                    for by_round in zip(
                        *(results.per_round("switchboard", n, c, CPU) for n in SWITCHBOARD),
                        strict=True,
                    )
                ]
                mine = results.per_round(target, name, c, CPU)
                m["cpu_vs_cheapest"] = statistics.median(ratios(mine, cheapest))
                m["cpu_vs_vllm_completions"] = statistics.median(ratios(mine, peer))
                out.setdefault(target, {}).setdefault(name, {})[c] = m
    return out


def table(medians: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for c in args.concurrency:
        for target, protocols in medians.items():
            for name, by_c in protocols.items():
                m = by_c[c]
                ttft = f"{m['ttft_p50_ms']:.1f}" if "ttft_p50_ms" in m else "-"
                rows.append(
                    [
                        c,
                        target,
                        name,
                        f"{m['output_tok_s']:.0f}",
                        ttft,
                        f"{m[CPU]:.0f}",
                        f"{m['cpu_vs_cheapest']:.2f}x",
                        f"{m['cpu_vs_vllm_completions']:.2f}x",
                    ]
                )
    goals = []
    for c in args.concurrency:
        sb = medians["switchboard"]
        openai = max(sb[n][c]["cpu_vs_vllm_completions"] for n in PEER)
        worst = max(sb.values(), key=lambda by_c: by_c[c]["cpu_vs_cheapest"])[c]
        goals.append(
            f"c={c}: Switchboard's OpenAI CPU/token up to {openai:.2f}x `vllm serve` "
            f"completions' (goal <= 0.5x); the dearest protocol {worst['cpu_vs_cheapest']:.2f}x "
            "the cheapest (goal <= 1.10x)."
        )
    return "\n".join(
        [
            f"Tiny model, one fixed {args.prompt_tokens}-token prompt, {OUTPUT_TOKENS} greedy "
            f"output tokens per request (checked), {args.requests} requests per run shared by "
            "its clients; "
            f"medians of {args.rounds} alternating round(s), ratios taken within each round. "
            "CPU: the server process's own user+sys (the frontend; the engine core excluded) "
            "per output token.",
            "",
            *markdown_table(
                [
                    "clients",
                    "server",
                    "protocol",
                    "output tok/s",
                    "TTFT p50 ms",
                    "frontend CPU us/tok",
                    "CPU vs cheapest",
                    "CPU vs vllm serve completions",
                ],
                rows,
            ),
            "",
            *goals,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--requests", type=int, default=96, help="requests per run, shared by its clients"
    )
    args = parser.parse_args()
    harness.tiny_model()
    targets = [harness.switchboard("switchboard"), harness.vllm_serve("vllm serve")]
    results = run_rounds(targets, measure_start(args), rounds=args.rounds, name="protocols")
    medians = summary(results, args)
    figures = {
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": OUTPUT_TOKENS,
        "requests_per_run": args.requests,
        "median": medians,
        **results.record(),
    }
    publish("protocols", figures, table(medians, args))


if __name__ == "__main__":
    main()
