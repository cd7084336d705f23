"""Batches (issue 40): does a batch slow interactive traffic, and how fast does a batch run
alone against `vllm run-batch` (vLLM's offline runner), on the same file and model.

The file: `--requests` chat completions (a short user message each, `--tokens` output
tokens under `ignore_eos`), one JSONL line each, as `vllm run-batch -i` reads it and the
openai SDK uploads it.

Per start of `switchboard serve` (as a user starts it, the lane's defaults unless
`--busy` / `--idle` give `--batch-busy-running` / `--batch-max-running` values, one
target each), after one warm request:

1. alone: the file uploaded (`files.create`), then `batches.create` to `completed` (the
   client polling every 0.1 s): the batch's output tok/s, from its output file's usage;
2. interactive alone: `--streams` clients streaming chat completions of
   `--interactive-tokens` tokens (`ignore_eos`), one after the other, for `--duration`
   s, in spells of `--spell` s with every client idle `--gap` s between them (longer than
   the lane's hold: a spell's first requests are what come to a server whose batch has
   the engine to itself, the rest come to one already busy): TTFT p50/p99 and their
   output tok/s; every request's TTFT is kept, and the table's p99 is that of every
   round's requests together, with how many it rests on;
3. the same interactive load while a batch runs (created first, running before the load
   starts; a file of `--beside-requests`, so that it outlasts the quiet before the load
   and the load: at the idle width, 1,500 requests end within the quiet): the same
   figures, and the batch's tok/s meanwhile (its results counted by its
   `request_counts`); the batch is cancelled after.

`vllm run-batch`: vLLM's own runner (`vllm.entrypoints.launchers.run_batch`, the code
behind `vllm run-batch -i IN -o OUT --model M`) in a process of its own, timed inside
it from reading the file to writing the output (its engine's start is not counted, as
Switchboard's is not), after a warm batch of one request on the same engine; its tok/s
from its output file's usage. Same engine flags as Switchboard's (`harness`), vLLM's
defaults otherwise.

Goals: interactive TTFT p50 and p99 with the batch within 1.2x of alone, its tok/s at
least 1/1.2 of alone; a batch alone at least 0.9x of `vllm run-batch`'s tok/s. One
process alive at a time, rounds alternating the order. Writes bench/results/batches.json
and the table between the `bench:batches` markers (docs/batches.md).

    /work/bin/heavy --exclusive .venv/bin/python bench/batches.py [--rounds 3] \
        [--requests 1500] [--tokens 64] [--duration 25] [--busy 2] [--idle 0] [--alone]

`--alone`: step 1 only, against run-batch, its table printed and nothing written (for
trying a change to the batch's own pace).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import harness
import httpx
import openai
import orjson
from harness import PY, Figures, Results, Round, Server, Target, markdown_table, publish

CHAT: Final = "/v1/chat/completions"
POLL_S = 0.1
ENDED = ("completed", "failed", "expired", "cancelled")
RUN_BATCH = "vllm run-batch"


def batch_file(path: Path, requests: int, tokens: int, model: str) -> Path:
    """The JSONL file both runners read."""
    lines = (
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Item {i}: say something."}],
                "max_tokens": tokens,
                "ignore_eos": True,
            },
        }
        for i in range(requests)
    )
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    return path


def output_tokens(text: str, requests: int) -> int:
    """The output tokens of an output file holding one successful line per request."""
    lines = [json.loads(line) for line in text.splitlines() if line]
    ids = sorted(line["custom_id"] for line in lines)
    if ids != sorted(f"req-{i}" for i in range(requests)):
        raise RuntimeError(f"{len(lines)} output lines for {requests} requests")
    failed = [line for line in lines if (line.get("response") or {}).get("status_code") != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, the first: {failed[0]}")
    return sum(int(line["response"]["body"]["usage"]["completion_tokens"]) for line in lines)


# -- Switchboard --------------------------------------------------------------------------


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _wait(client: openai.OpenAI, batch_id: str, done: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + 3600
    while not done(batch := client.batches.retrieve(batch_id)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id}: {batch}")
        time.sleep(POLL_S)
    return batch


def _created(client: openai.OpenAI, upload_id: str) -> str:
    batch = client.batches.create(input_file_id=upload_id, endpoint=CHAT, completion_window="24h")
    return batch.id


def batch_alone(server: Server, upload_id: str, requests: int) -> Figures:
    client = _client(server)
    started = time.perf_counter()
    batch = _wait(client, _created(client, upload_id), lambda b: b.status in ENDED)
    wall_s = time.perf_counter() - started
    if batch.status != "completed" or batch.output_file_id is None:
        raise RuntimeError(f"the batch ended {batch.status}: {batch}")
    tokens = output_tokens(client.files.content(batch.output_file_id).text, requests)
    return {"output_tok_s": tokens / wall_s, "wall_s": wall_s, "tokens": tokens}


async def _stream(http: httpx.AsyncClient, url: str, tokens: int, n: int) -> tuple[float, int]:
    """One streamed chat: its TTFT (s) and its output tokens (its usage)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Question {n}?"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft: float | None = None
    count = 0
    async with http.stream("POST", url, json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("usage"):
                count = int(chunk["usage"]["completion_tokens"])
            elif ttft is None and any(c["delta"].get("content") for c in chunk["choices"]):
                ttft = time.perf_counter() - started
    if ttft is None or count != tokens:
        raise RuntimeError(f"a streamed chat gave {count} of {tokens} tokens")
    return ttft, count


def _percentile(values: Sequence[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


async def _interactive(
    server: Server, streams: int, tokens: int, duration_s: float, spell_s: float, gap_s: float
) -> Figures:
    """`streams` clients, back to back within spells of `spell_s` s, all idle for `gap_s`
    between spells (longer than the lane's hold, so each spell's first requests arrive on
    a lane back at its idle width): every request's send time (s into the load), TTFT (ms)
    and whether it opened its client's spell."""
    url = f"{server.url}{CHAT}"
    samples: list[tuple[float, float, bool]] = []
    total = 0
    started = time.perf_counter()
    deadline = started + duration_s

    async def client(http: httpx.AsyncClient, index: int) -> None:
        nonlocal total
        n = 0
        spell, opened = 0, -1
        while (now := time.perf_counter()) < deadline:
            spell_start = started + spell * (spell_s + gap_s)
            if now >= spell_start + spell_s:  # this spell is over: wait for the next
                spell += 1
                await asyncio.sleep(max(0.0, spell_start + spell_s + gap_s - now))
                continue
            first, opened = opened != spell, spell
            ttft, count = await _stream(http, url, tokens, index * 1_000_000 + n)
            samples.append((now - started, ttft * 1e3, first))
            total += count
            n += 1

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(http, i) for i in range(streams)))
    wall_s = time.perf_counter() - started
    ttfts = [ttft for _, ttft, _ in samples]
    firsts = [ttft for _, ttft, first in samples if first]
    return {
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": _percentile(ttfts, 99),
        "first_ttft_p50_ms": statistics.median(firsts),
        "output_tok_s": total / wall_s,
        "requests": len(ttfts),
        "firsts": len(firsts),
        "samples": [[round(t, 3), round(ttft, 2), first] for t, ttft, first in samples],
    }


def interactive(server: Server, args: argparse.Namespace) -> Figures:
    return asyncio.run(
        _interactive(
            server, args.streams, args.interactive_tokens, args.duration, args.spell, args.gap
        )
    )


def _answered(batch: Any) -> int:
    counts = batch.request_counts
    return 0 if counts is None else int(counts.completed + counts.failed)


def interactive_beside_a_batch(server: Server, upload_id: str, args: argparse.Namespace) -> Figures:
    """The interactive load while the batch runs: created first and under way (a result
    written) before the load starts; cancelled after it."""
    client = _client(server)
    batch_id = _created(client, upload_id)
    _wait(client, batch_id, lambda b: b.status in ENDED or _answered(b) > 0)
    # The first spell's first requests come to the batch at its idle width (the lane
    # narrowed by the interactive load alone has widened again).
    time.sleep(args.quiet)
    before = _answered(client.batches.retrieve(batch_id))
    started = time.perf_counter()
    figures = interactive(server, args)
    during = _answered(client.batches.retrieve(batch_id)) - before
    wall_s = time.perf_counter() - started
    if during >= args.beside_requests - before:
        raise RuntimeError("the batch ended within the load: use more --beside-requests")
    client.batches.cancel(batch_id)
    _wait(client, batch_id, lambda b: b.status in ENDED)
    return {**figures, "batch_tok_s": during * args.tokens / wall_s}


def measure(
    args: argparse.Namespace, file: Path, beside: Path
) -> Callable[[Server, Round], Figures]:
    def one_start(server: Server, round_: Round) -> Figures:
        server.warm(CHAT)
        time.sleep(args.quiet)  # the warm request was interactive traffic: the lane widens
        client = _client(server)
        with file.open("rb") as data:
            upload_id = client.files.create(file=(file.name, data), purpose="batch").id
        figures = {"batch_alone": batch_alone(server, upload_id, args.requests)}
        if not args.alone:
            figures["interactive_alone"] = interactive(server, args)
            with beside.open("rb") as data:
                beside_id = client.files.create(file=(beside.name, data), purpose="batch").id
            figures["interactive_with_batch"] = interactive_beside_a_batch(server, beside_id, args)
        return figures

    return one_start


# -- vllm run-batch -----------------------------------------------------------------------


def run_batch_target(file: Path, requests: int) -> Target:
    """`vllm run-batch` in a process of its own (this script, `--run-batch-child`), which
    writes the seconds its runner took; its figures."""

    def child(round_: Round, log: Path) -> Figures:
        work = Path(tempfile.mkdtemp(prefix="run-batch-"))
        warm = batch_file(work / "warm.jsonl", 1, 4, "tiny")
        output, timing = work / "out.jsonl", work / "seconds"
        command = [PY, __file__, "--run-batch-child", str(warm), str(timing)]
        command += ["-i", str(file), "-o", str(output), "--model", str(harness.MODEL)]
        command += ["--served-model-name", "tiny", *harness.ENGINE_FLAGS]
        kv = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        with log.open("wb") as out:
            subprocess.run(
                command, env={**os.environ, **kv}, stdout=out, stderr=subprocess.STDOUT, check=True
            )
        wall_s = float(timing.read_text())
        tokens = output_tokens(output.read_text(), requests)
        return {
            "batch_alone": {"output_tok_s": tokens / wall_s, "wall_s": wall_s, "tokens": tokens}
        }

    return Target(RUN_BATCH, child=child)


def run_batch_child(argv: Sequence[str]) -> None:
    """In the child: vLLM's runner on `argv` (run-batch's own arguments), a warm batch
    first on the same engine; the seconds the real one took to `timing`."""
    warm, timing, *rest = argv
    from vllm.entrypoints.launchers import run_batch as runner

    sys.argv = ["vllm run-batch", *rest]
    args = runner.parse_args()
    run = runner.run_batch

    async def timed(engine: Any, args: argparse.Namespace) -> None:
        first = copy.copy(args)
        first.input_file, first.output_file = warm, str(Path(warm).with_suffix(".out"))
        await run(engine, first)
        started = time.perf_counter()
        await run(engine, args)
        Path(timing).write_text(str(time.perf_counter() - started))

    runner.run_batch = timed
    asyncio.run(runner.main(args))


# -- the table ----------------------------------------------------------------------------


def alone_table(results: Results, names: Sequence[str]) -> list[str]:
    """The batch alone: each runner's tok/s, and its ratio to run-batch's round by round."""
    rows: list[list[object]] = []
    for name in [*names, RUN_BATCH]:
        tok_s = results.per_round(name, "batch_alone", "output_tok_s")
        versus = harness.ratios(tok_s, results.per_round(RUN_BATCH, "batch_alone", "output_tok_s"))
        rows.append([name, harness.spread(tok_s), f"**{statistics.median(versus):.2f}x**"])
    return [
        "The batch alone on an idle server (Switchboard: create to completed; `vllm "
        "run-batch`: its runner, reading the file to writing the output):",
        "",
        *markdown_table(["runner", "output tok/s", "vs vllm run-batch"], rows),
    ]


def table(results: Results, args: argparse.Namespace, names: Sequence[str]) -> str:
    def med(target: str, *path: str) -> float:
        return statistics.median(results.per_round(target, *path))

    def ratio(a: str, b: str, target: str, key: str) -> float:
        return statistics.median(
            harness.ratios(results.per_round(target, a, key), results.per_round(target, b, key))
        )

    def samples(target: str, phase: str) -> list[tuple[float, float, bool]]:
        """Every round's requests of a phase: (s into the load, TTFT ms, opened a spell)."""
        return [
            (at, ttft, first)
            for starts in results.raw[target]
            for figures in starts
            for at, ttft, first in figures[phase]["samples"]
        ]

    def pooled(target: str, phase: str, *, firsts: bool = False) -> list[float]:
        """Every round's TTFTs (ms) of a phase (`firsts`: those opening a spell)."""
        return [ttft for _, ttft, first in samples(target, phase) if first or not firsts]

    def tail(target: str, phase: str) -> str:
        """What the phase's p99 rests on: the requests above it, how many opened a spell."""
        every = samples(target, phase)
        slowest = sorted(((ttft, first) for _, ttft, first in every), reverse=True)[
            : len(every) // 100
        ]
        opened = sum(first for _, _, first in every)
        quiet = [ttft for at, ttft, first in every if first and at < args.spell]
        return (
            f"{phase.replace('_', ' ')}: p99 of {len(every)} requests, the {len(slowest)} "
            f"slowest above it ({sum(first for _, first in slowest)} of them opening a spell, "
            f"as {opened} of all did); the first spell's {len(quiet)} first requests "
            f"{statistics.median(quiet):.0f} ms (max {max(quiet):.0f})"
        )

    rows: list[list[object]] = []
    tails: list[str] = []
    for name in names:
        alone, beside = "interactive_alone", "interactive_with_batch"
        p99 = [_percentile(pooled(name, phase), 99) for phase in (alone, beside)]
        firsts = [statistics.median(pooled(name, phase, firsts=True)) for phase in (alone, beside)]
        rows.append(
            [
                name,
                f"{med(name, alone, 'ttft_p50_ms'):.0f} / {med(name, beside, 'ttft_p50_ms'):.0f}"
                f" (**{ratio(beside, alone, name, 'ttft_p50_ms'):.2f}x**)",
                f"{p99[0]:.0f} / {p99[1]:.0f} (**{p99[1] / p99[0]:.2f}x**; by round "
                + ", ".join(
                    f"{r:.2f}x"
                    for r in harness.ratios(
                        results.per_round(name, beside, "ttft_p99_ms"),
                        results.per_round(name, alone, "ttft_p99_ms"),
                    )
                )
                + ")",
                f"{firsts[0]:.0f} / {firsts[1]:.0f} (**{firsts[1] / firsts[0]:.2f}x**)",
                f"{med(name, alone, 'output_tok_s'):.0f} / {med(name, beside, 'output_tok_s'):.0f}"
                f" (**{ratio(beside, alone, name, 'output_tok_s'):.2f}x**)",
                f"{med(name, beside, 'batch_tok_s'):.0f}",
            ]
        )
        tails.append(f"{name}: " + "; ".join(tail(name, phase) for phase in (alone, beside)))
    return "\n".join(
        [
            f"Tiny model; a batch of {args.requests} chat completions of {args.tokens} tokens "
            f"(`ignore_eos`); interactive: {args.streams} clients streaming chats of "
            f"{args.interactive_tokens} tokens one after the other for {args.duration:.0f} s, "
            f"in spells of {args.spell:.0f} s all idle {args.gap:.1f} s between them (each "
            "spell's first requests come to a lane back at its idle width); "
            f"{args.rounds} alternating round(s): p50 and tok/s medians of the rounds' "
            "(ratios round by round), p99 of every round's requests together (ratio of the "
            "two; by round). Alone / with the batch running:",
            "",
            *markdown_table(
                [
                    "server",
                    "TTFT p50 ms",
                    "TTFT p99 ms",
                    "TTFT p50 ms, a spell's first",
                    "interactive tok/s",
                    "batch tok/s meanwhile",
                ],
                rows,
            ),
            "",
            *(f"- {tail}" for tail in tails),
            "",
            *alone_table(results, names),
        ]
    )


def main() -> None:
    if sys.argv[1:2] == ["--run-batch-child"]:
        run_batch_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument(
        "--beside-requests",
        type=int,
        default=5000,
        help="the batch beside interactive load (it must outlast the quiet and the load)",
    )
    parser.add_argument("--tokens", type=int, default=64, help="a batch request's output")
    parser.add_argument("--streams", type=int, default=4, help="interactive clients")
    parser.add_argument("--interactive-tokens", type=int, default=16)
    parser.add_argument("--duration", type=float, default=25.0, help="s of interactive load")
    parser.add_argument("--spell", type=float, default=5.0, help="s of clients back to back")
    parser.add_argument("--gap", type=float, default=1.5, help="s all clients idle after a spell")
    parser.add_argument(
        "--quiet",
        type=float,
        default=11.0,
        help="s without interactive traffic before a batch alone and before the load beside "
        "one (past the server's --batch-recent-s: the lane at its idle width)",
    )
    parser.add_argument(
        "--busy", type=int, nargs="+", default=[2], help="--batch-busy-running values"
    )
    parser.add_argument(
        "--idle",
        type=int,
        nargs="+",
        default=[0],
        help="--batch-max-running values (0: the server's default)",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="the batch alone only (no interactive load): its table printed, nothing written",
    )
    args = parser.parse_args()
    harness.tiny_model()
    work = Path(tempfile.mkdtemp(prefix="batches-"))
    file = batch_file(work / "in.jsonl", args.requests, args.tokens, "tiny")
    beside = batch_file(work / "beside.jsonl", args.beside_requests, args.tokens, "tiny")
    # Each target's batches on a store of its own: none left active by an earlier run.
    switchboards: Mapping[str, Target] = {
        (
            name := f"switchboard busy={busy}" + (f" idle={idle}" if idle else "")
        ): harness.switchboard(
            name,
            *("--batch-busy-running", str(busy)),
            *("--batch-max-running", str(idle)),
            *("--batch-store", str(work / f"store-{busy}-{idle}.sqlite3")),
        )
        for busy in args.busy
        for idle in args.idle
    }
    targets = [*switchboards.values(), run_batch_target(file, args.requests)]
    results = harness.run_rounds(
        targets, measure(args, file, beside), rounds=args.rounds, name="batches"
    )
    if args.alone:
        print(f"A batch of {args.requests} requests, {args.rounds} alternating round(s):")
        print("\n".join(alone_table(results, list(switchboards))))
        return
    figures = {"settings": vars(args), **results.record()}
    publish("batches", figures, table(results, args, list(switchboards)))


if __name__ == "__main__":
    main()
