"""Overload: an open-loop burst at ~10x the engine's capacity, Switchboard with its
admission bound against `vllm serve --max-num-queued-reqs` with the same bound.

Load: streamed `/v1/completions` (a text prompt of ~128 tokens, 64 output tokens under
`ignore_eos`, usage in the last chunk), arriving as a seeded Poisson process at
`--factor` times the capacity for `--duration` s, whatever the server answers (open
loop: a slow or refused answer does not slow the arrivals). The capacity (completed
requests/s) is measured first, closed loop at `MAX_NUM_SEQS` concurrency on Switchboard,
unless `--rate` gives the arrival rate.

The same bound: both servers may keep `--bound` requests WAITING beside the
`MAX_NUM_SEQS` the engine runs (passed to both as `--max-num-seqs`). Switchboard's
`--max-queued-requests` counts waiting requests only; vLLM's `--max-num-queued-reqs`
counts waiting + running, so it gets `bound + MAX_NUM_SEQS`.

Per server: goodput (output tok/s of the requests that completed, over the burst from
the first arrival to the last answer), p50/p99 TTFT of those, refusals: 503 with and
without a `Retry-After` header, and a 200 whose stream holds only an error (vLLM refuses
a streamed request that way once it has rendered its prompt); other 5xx (goal 0),
connection errors (refused, reset or timed out), other failures, the peak RSS of the
server's process tree (frontend + engine core), sampled every 0.5 s, and the frontend's
CPU seconds over the burst. One server alive at a time. Writes bench/results/overload.json
and the table between the `bench:overload` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/overload.py \
        [--duration 60] [--factor 10] [--bound 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import harness
import psutil
from harness import Server, Target, markdown_table, publish

MAX_NUM_SEQS = 128  # vLLM's CPU default, given explicitly to both servers
OUTPUT_LEN = 64
PROMPT_WORDS = 100  # ~128 tokens of the tiny model's tokenizer
WORDS = ["the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "by"]


def targets(bound: int) -> list[Target]:
    """The same bound on every server: `bound` waiting beside the `MAX_NUM_SEQS` running.
    "switchboard unpinned": `--pin-frontend false`. The default was unpinned from
    2026-11-25 to 2026-11-26, and runs published then name the default "switchboard" and
    the other "switchboard pinned"; runs before and since, "switchboard" is pinned. The
    load client runs on the same two cores and needs more than one at this rate; the
    pinned frontend shares its one core with it, where a remote client would leave it
    alone (both rows are shown)."""
    seqs = ("--max-num-seqs", str(MAX_NUM_SEQS))
    ours = (*seqs, "--max-queued-requests", str(bound), "--max-queued-tokens", "0")
    return [
        harness.switchboard("switchboard", *ours),
        harness.switchboard("switchboard unpinned", *ours, "--pin-frontend", "false"),
        harness.vllm_serve("vllm serve", *seqs, "--max-num-queued-reqs", str(bound + MAX_NUM_SEQS)),
    ]


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(PROMPT_WORDS))


@dataclass
class Outcome:
    # ok | refused_retry | refused_no_retry | refused_in_stream | other_5xx | connection |
    # failed
    kind: str
    ttft_s: float | None = None
    tokens: int = 0
    ended_at: float = 0.0
    detail: str = ""


async def one(session: aiohttp.ClientSession, url: str, text: str) -> Outcome:
    body = {
        "model": "tiny",
        "prompt": text,
        "max_tokens": OUTPUT_LEN,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    try:
        async with session.post(url, json=body) as response:
            if response.status == 503:
                await response.read()
                retry = "Retry-After" in response.headers
                return Outcome("refused_retry" if retry else "refused_no_retry", ended_at=start)
            if response.status >= 500:
                return Outcome("other_5xx", detail=str(response.status), ended_at=start)
            if response.status != 200:
                return Outcome("failed", detail=f"HTTP {response.status}", ended_at=start)
            ttft, tokens, error = None, 0, ""
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = str(chunk["error"].get("message", ""))[:80]
                elif chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                    ttft = time.perf_counter() - start
            now = time.perf_counter()
            if error and ttft is None:
                # A 200 whose stream is only an error: a refusal after the prompt was
                # rendered (vLLM's admission), with no retry hint.
                return Outcome("refused_in_stream", detail=error, ended_at=now)
            if error or tokens == 0:
                return Outcome("failed", detail=error or "no usage", ended_at=now)
            return Outcome("ok", ttft, tokens, now)
    except (TimeoutError, aiohttp.ClientError) as exc:
        # Refused a connection, reset, or timed out: the server (or its backlog) gave up.
        return Outcome("connection", detail=type(exc).__name__, ended_at=time.perf_counter())


def _session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600, sock_connect=30)
    )


async def capacity(port: int, seconds: float) -> float:
    """Completed requests/s, closed loop at MAX_NUM_SEQS concurrency."""
    url = f"http://127.0.0.1:{port}/v1/completions"
    rng = random.Random(1)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            if (await one(session, url, prompt(rng))).kind == "ok":
                done += 1

    async with _session() as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(MAX_NUM_SEQS)))
        return done / (time.perf_counter() - start)


@dataclass
class Sampler:
    """Peak RSS of a process tree, sampled in a thread."""

    pid: int
    peak_bytes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        root = psutil.Process(self.pid)
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                total = 0
                for proc in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):  # gone meanwhile
                        total += proc.memory_info().rss
                self.peak_bytes = max(self.peak_bytes, total)
            except psutil.NoSuchProcess:
                return
            except OSError:  # EMFILE: the burst's own sockets took every descriptor
                pass  # a missed sample; the next one may get through
            self._stop.wait(0.5)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def burst(server: Server, rate: float, duration: float) -> dict[str, Any]:
    url = f"{server.url}/v1/completions"
    rng = random.Random(0)
    arrivals: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        arrivals.append(t)
    prompts = [prompt(rng) for _ in arrivals]
    with server.meter(tokens=False) as meter, Sampler(server.pid) as sampler:
        async with _session() as session:
            start = time.perf_counter()
            tasks = []
            for at, text in zip(arrivals, prompts, strict=True):
                delay = start + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(session, url, text)))
            sent_s = time.perf_counter() - start
            outcomes: list[Outcome] = await asyncio.gather(*tasks)
    ok = [o for o in outcomes if o.kind == "ok"]
    window = max([o.ended_at for o in ok], default=start) - start
    ttfts = sorted(o.ttft_s for o in ok if o.ttft_s is not None)
    kinds = ("ok", "refused_retry", "refused_no_retry", "refused_in_stream", "other_5xx")
    counts = {k: sum(o.kind == k for o in outcomes) for k in (*kinds, "connection")}
    failures: dict[str, int] = {}
    for o in outcomes:
        if o.kind in ("failed", "connection"):
            failures[o.detail] = failures.get(o.detail, 0) + 1
    return {
        "offered": len(arrivals),
        "offered_rate": rate,
        "sending_took_s": sent_s,  # > duration: the client could not keep the pace
        **counts,
        "failed": sum(o.kind == "failed" for o in outcomes),
        "failures": failures,
        "goodput_tok_s": sum(o.tokens for o in ok) / window if window > 0 else 0.0,
        "ttft_p50_ms": _percentile(ttfts, 50) * 1000,
        "ttft_p99_ms": _percentile(ttfts, 99) * 1000,
        "peak_rss_mib": sampler.peak_bytes / 2**20,
        "frontend_cpu_s": meter.cpu_s,
    }


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, int(p) - 1))]


def table(results: dict[str, dict[str, Any]], info: dict[str, Any]) -> str:
    if math.isnan(info["capacity"]):  # the rate was given (`--rate`), not measured here
        offered = "given with --rate"
    else:
        offered = f"{info['factor']}x the measured capacity of {info['capacity']:.1f} req/s"
    head = (
        f"Tiny model, ~128-token text prompts, {OUTPUT_LEN} output tokens (ignore_eos), "
        f"streamed; Poisson arrivals at {info['rate']:.1f} req/s ({offered}) for "
        f"{info['duration']:.0f} s; "
        f"at most {info['bound']} requests waiting beside the {MAX_NUM_SEQS} running on "
        "both servers."
    )
    header = [
        "server",
        "offered",
        "completed",
        "goodput tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "503 with Retry-After",
        "503 without",
        "refused inside a 200 stream",
        "other 5xx",
        "connection errors",
        "other failures",
        "peak RSS MiB",
        "frontend CPU s",
    ]
    rows = [
        [
            target,
            r["offered"],
            r["ok"],
            f"{r['goodput_tok_s']:.0f}",
            f"{r['ttft_p50_ms']:.0f}",
            f"{r['ttft_p99_ms']:.0f}",
            r["refused_retry"],
            r["refused_no_retry"],
            r["refused_in_stream"],
            r["other_5xx"],
            r["connection"],
            r["failed"],
            f"{r['peak_rss_mib']:.0f}",
            f"{r['frontend_cpu_s']:.1f}",
        ]
        for target, r in results.items()
    ]
    return "\n".join([head, "", *markdown_table(header, rows)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--bound", type=int, default=64)
    parser.add_argument("--rate", type=float, help="arrivals/s (default: factor x capacity)")
    parser.add_argument("--capacity-s", type=float, default=20.0, help="capacity run length")
    parser.add_argument("--no-publish", action="store_true", help="print, write nothing")
    args = parser.parse_args()
    harness.tiny_model()
    results: dict[str, dict[str, Any]] = {}
    cap = float("nan")
    rate = args.rate
    for target in targets(args.bound):
        with harness.started(target) as server:
            server.warm()
            if rate is None:
                cap = asyncio.run(capacity(server.port, args.capacity_s))
                rate = args.factor * cap
                print(f"capacity {cap:.1f} req/s -> offering {rate:.1f} req/s", flush=True)
            results[target.name] = asyncio.run(burst(server, rate, args.duration))
            print(target.name, json.dumps(results[target.name]), flush=True)
    info = {
        "capacity": cap,
        "rate": rate,
        "factor": args.factor,
        "duration": args.duration,
        "bound": args.bound,
    }
    md = table(results, info)
    if args.no_publish:
        print(md)
        return
    figures = {**info, "max_num_seqs": MAX_NUM_SEQS, "output_len": OUTPUT_LEN, "results": results}
    publish("overload", figures, md)


if __name__ == "__main__":
    main()
