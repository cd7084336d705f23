"""Routing policies over two replicas against one replica alone: multi-turn conversations,
vLLM's own prefix-cache counters and the client's TTFT (issue 30 item 5).

Each target starts a fresh fleet (`app.fleet`: replicas of the tiny model at a 4k context,
each publishing vLLM's KV-cache events, and one router) and runs the same conversations
through its router: CONVERSATIONS of them, each a long system prompt of its own and TURNS
user turns, CONCURRENCY conversations at a time, each turn streamed and sent back whole
with the answer at the next. What is measured, over every replica:

- the prefix-cache hit rate: vLLM's `vllm:prefix_cache_hits_total` over
  `vllm:prefix_cache_queries_total` (tokens), as the engines count them;
- TTFT (the first content byte after the request), median and p90, and of the later turns
  alone (the ones a cache can serve);
- how the requests were spread (the busier replica's share).

The ceiling is the same conversations on one replica (behind the same router, so that
each target pays the same hop): every later turn finds its prefix there. Policies:
vllm-router's round_robin (the floor: a turn lands where its prefix is by chance),
cache_aware (its prefix tree of rendered tokens) and kv_aware (the engines' own KV
events), and SMG's cache_aware (its prefix tree of the messages' text).

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/fleet_routing.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from harness import (
    _8K,
    TINY_8K,
    Figures,
    Round,
    Target,
    markdown_table,
    publish,
    run_rounds,
    spread,
    tiny_model,
)

from app.fleet.fleet import Fleet, RouterSpec, running
from app.fleet.routers import SMG, VLLM_ROUTER

NAME = "fleet_routing"
CONVERSATIONS = 24
TURNS = 4
CONCURRENCY = 8
SYSTEM_WORDS = 700  # about 1,000 tokens of the tiny model's vocabulary
MAX_TOKENS = 24
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "omega",
    "river",
    "stone",
    "cloud",
    "maple",
    "ember",
    "quartz",
    "lantern",
]

TARGETS = {
    "1 replica (ceiling)": (1, RouterSpec(VLLM_ROUTER, "round_robin")),
    "vllm-router round_robin": (2, RouterSpec(VLLM_ROUTER, "round_robin")),
    "vllm-router cache_aware": (2, RouterSpec(VLLM_ROUTER, "cache_aware")),
    "vllm-router kv_aware": (2, RouterSpec(VLLM_ROUTER, "kv_aware")),
    "smg cache_aware": (2, RouterSpec(SMG, "cache_aware")),
}


def conversations(seed: int) -> list[list[dict[str, str]]]:
    """Each conversation's system prompt (its own long prefix), the same for every target
    of a round."""
    rng = random.Random(seed)
    return [
        [
            {
                "role": "system",
                "content": f"Conversation {i}. "
                + " ".join(rng.choice(WORDS) for _ in range(SYSTEM_WORDS)),
            }
        ]
        for i in range(CONVERSATIONS)
    ]


async def _turn(
    client: httpx.AsyncClient, url: str, messages: list[dict[str, str]]
) -> tuple[float, str]:
    """One streamed turn: its TTFT and its answer."""
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    ttft = None
    text = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if ttft is None and '"content":"' in line and '"content":""' not in line:
                ttft = time.perf_counter() - started
            text.append(line)
    content = "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in text
    )
    return (ttft if ttft is not None else time.perf_counter() - started), content


async def _workload(url: str, seed: int) -> dict[str, list[float]]:
    queue = list(enumerate(conversations(seed)))
    ttfts: dict[str, list[float]] = {"first": [], "later": []}
    limits = httpx.Limits(max_connections=CONCURRENCY * 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def worker() -> None:
            while queue:
                i, messages = queue.pop(0)
                for turn in range(TURNS):
                    messages.append({"role": "user", "content": f"Question {turn} of {i}?"})
                    ttft, answer = await _turn(client, url, messages)
                    ttfts["first" if turn == 0 else "later"].append(ttft)
                    messages.append({"role": "assistant", "content": answer})

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return ttfts


def _counters(fleet: Fleet) -> list[dict[str, float]]:
    return [
        {
            "hits": r.metric("vllm:prefix_cache_hits_total"),
            "queries": r.metric("vllm:prefix_cache_queries_total"),
            "requests": r.metric("vllm:request_success_total"),
        }
        for r in fleet.replicas
    ]


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def measure(replicas: int, router: RouterSpec) -> Callable[[Round, Path], Figures]:
    def run(round_: Round, log: Path) -> Figures:
        workdir = Path(tempfile.mkdtemp(prefix="fleet-routing-", dir=log.parent))
        serve = [
            "--model", str(tiny_model(TINY_8K, *_8K)),
            "--served-model-name", "tiny",
            "--dtype", "float32",
            "--max-model-len", "4096",
            "--log-level", "warning",
        ]  # fmt: skip
        fleet = Fleet(
            workdir, serve, count=replicas, routers={"router": router}, shared_store=False
        )
        with running(fleet):
            url = fleet.router().url
            # Warm each engine (its first batch is slow) with prompts no conversation shares.
            warm = {"model": "tiny", "prompt": "warm", "max_tokens": 2}
            for replica in fleet.replicas:
                httpx.post(f"{replica.url}/v1/completions", json=warm, timeout=300)
            before = _counters(fleet)
            ttfts = asyncio.run(_workload(url, round_.seed()))
            after = _counters(fleet)
        delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
        hits = sum(d["hits"] for d in delta)
        queries = sum(d["queries"] for d in delta)
        requests = [d["requests"] for d in delta]
        every = ttfts["first"] + ttfts["later"]
        return {
            "hit_rate": hits / queries if queries else 0.0,
            "ttft_ms": {
                "p50": statistics.median(every) * 1e3,
                "p90": _p90(every) * 1e3,
                "later_p50": statistics.median(ttfts["later"]) * 1e3,
            },
            "busiest_share": max(requests) / sum(requests),
            "requests": requests,
        }

    return run


def table(results: Any) -> str:
    ceiling = results.per_round("1 replica (ceiling)", "hit_rate")
    rows = []
    for name in TARGETS:
        rates = results.per_round(name, "hit_rate")
        rows.append(
            [
                name,
                spread([100 * r for r in rates], 1) + " %",
                spread([100 * (r - c) for r, c in zip(rates, ceiling, strict=True)], 1),
                spread(results.per_round(name, "ttft_ms", "p50")),
                spread(results.per_round(name, "ttft_ms", "p90")),
                spread(results.per_round(name, "ttft_ms", "later_p50")),
                spread([100 * s for s in results.per_round(name, "busiest_share")]) + " %",
            ]
        )
    header = [
        "target",
        "prefix-cache hit rate",
        "points from the ceiling",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "later turns' TTFT p50 (ms)",
        "busiest replica's share",
    ]
    return "\n".join(markdown_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    targets = [
        Target(name, child=measure(replicas, router))
        for name, (replicas, router) in TARGETS.items()
    ]
    results = run_rounds(targets, lambda server, round_: {}, rounds=args.rounds, name=NAME)
    figures = {
        "workload": {
            "conversations": CONVERSATIONS,
            "turns": TURNS,
            "concurrency": CONCURRENCY,
            "system_words": SYSTEM_WORDS,
            "max_tokens": MAX_TOKENS,
        },
        **results.record(),
    }
    publish(NAME, figures, table(results))


if __name__ == "__main__":
    main()
