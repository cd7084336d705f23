"""json_schema-constrained vs unconstrained chat, Switchboard vs `vllm serve`, on the same
machine and tiny model, in the same run.

Load: streamed chat completions (our own asyncio client, `stream_options.include_usage`)
at a fixed concurrency; constrained requests carry `response_format: json_schema` with a
bounded schema, unconstrained ones `ignore_eos` with the same max_tokens. Both servers run
with the same `--structured-outputs-config` (xgrammar, no free whitespace: a random
model left free to write whitespace rarely closes the object). Figures: output tok/s,
TTFT p50/p99, and frontend CPU per output token (the server process's own user+sys CPU,
engine-core child excluded).

One CPU engine at a time; targets alternate over rounds and the figures are medians over
rounds. Writes bench/results/structured.json and the table
between the `bench:structured` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/structured_chat.py \
        [--rounds 3] [--requests 64] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import harness
import httpx
from harness import Server, markdown_table, publish

MAX_TOKENS = 96
# A random model left free to write whitespace rarely closes the object.
STRUCTURED = (
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
)
TARGETS = (
    harness.switchboard("switchboard", *STRUCTURED),
    harness.vllm_serve("vllm serve", *STRUCTURED),
)
MODES = ("unconstrained", "json_schema")
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{2}$"},
        "ok": {"type": "boolean"},
    },
    "required": ["colour", "code", "ok"],
    "additionalProperties": False,
}


def body(mode: str, i: int) -> dict[str, object]:
    out: dict[str, object] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Describe thing number {i} as JSON."}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "seed": i,
    }
    if mode == "json_schema":
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
        }
    else:
        out["ignore_eos"] = True
    return out


async def one(client: httpx.AsyncClient, url: str, payload: dict[str, object]) -> tuple[float, int]:
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", url, json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if (
                ttft is None
                and chunk.get("choices")
                and chunk["choices"][0]["delta"].get("content")
            ):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return (ttft if ttft is not None else time.perf_counter() - start), tokens


async def load(
    port: int, mode: str, requests: int, concurrency: int
) -> tuple[list[float], int, float]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def run(i: int) -> tuple[float, int]:
            async with gate:
                return await one(client, url, body(mode, i))

        start = time.perf_counter()
        results = await asyncio.gather(*(run(i) for i in range(requests)))
        wall = time.perf_counter() - start
    return [r[0] for r in results], sum(r[1] for r in results), wall


def measure(server: Server, mode: str, requests: int, concurrency: int) -> dict[str, float]:
    with server.meter(tokens=False) as meter:
        ttfts, tokens, wall = asyncio.run(load(server.port, mode, requests, concurrency))
    cpu = meter.cpu_s
    ttfts.sort()
    return {
        "output_tok_s": tokens / wall,
        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] * 1e3,
        "frontend_cpu_us_per_tok": cpu / max(tokens, 1) * 1e6,
        "output_tokens": tokens,
    }


def table(summary: dict[str, dict[str, dict[str, float]]], rounds: int) -> str:
    rows = []
    for target, modes in summary.items():
        for mode, m in modes.items():
            rows.append(
                [
                    target,
                    mode,
                    f"{m['output_tok_s']:.0f}",
                    f"{m['ttft_p50_ms']:.0f}",
                    f"{m['ttft_p99_ms']:.0f}",
                    f"{m['frontend_cpu_us_per_tok']:.0f}",
                ]
            )
    header = ["target", "chat", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "frontend CPU µs/tok"]
    note = f"Medians over {rounds} round(s); see bench/structured_chat.py."
    return "\n".join([*markdown_table(header, rows), "", note])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-publish", action="store_true", help="print, write nothing")
    args = parser.parse_args()
    harness.tiny_model()

    def one_start(server: Server, round_: harness.Round) -> harness.Figures:
        # The first requests of a fresh CPU engine (and the first grammar compile) pay
        # their warm-up; keep them out of the figures.
        measure(server, "json_schema", 2, 1)
        out = {}
        for mode in MODES:
            out[mode] = measure(server, mode, args.requests, args.concurrency)
            print(server.target.name, mode, json.dumps(out[mode]), flush=True)
        return out

    results = harness.run_rounds(TARGETS, one_start, rounds=args.rounds, name="structured")
    summary = {
        t.name: {
            m: {
                k: statistics.median(results.per_round(t.name, m, k))
                for k in results.raw[t.name][0][0][m]
            }
            for m in MODES
        }
        for t in TARGETS
    }
    md = table(summary, args.rounds)
    if args.no_publish:
        print(md)
        return
    figures = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": MAX_TOKENS,
        "summary": summary,
        **results.record(),
    }
    publish("structured", figures, md)


if __name__ == "__main__":
    main()
