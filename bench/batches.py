"""Batches (issue 40): does a batch slow interactive traffic, and how fast does a batch run
alone against `vllm run-batch` (vLLM's offline runner), on the same file and model.

The file: `--requests` chat completions (a short user message each, `--tokens` output
tokens under `ignore_eos`), one JSONL line each, as `vllm run-batch -i` reads it and the
openai SDK uploads it.

Per start of `switchboard serve` (as a user starts it, the lane's defaults unless
`--busy` gives `--batch-busy-running` values, one target each), after one warm request:

1. alone: the file uploaded (`files.create`), then `batches.create` to `completed` (the
   client polling every 0.1 s): the batch's output tok/s, from its output file's usage;
2. interactive alone: `--streams` clients streaming chat completions of
   `--interactive-tokens` tokens (`ignore_eos`), one after the other, for `--duration`
   s: TTFT p50/p99 and their output tok/s;
3. the same interactive load while the same batch runs (created first, running before
   the load starts): the same figures, and the batch's tok/s meanwhile (its results
   counted by its `request_counts`); the batch is cancelled after.

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
        [--requests 2000] [--tokens 64] [--duration 20] [--busy 2 0]
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


async def _interactive(server: Server, streams: int, tokens: int, duration_s: float) -> Figures:
    url = f"{server.url}{CHAT}"
    ttfts: list[float] = []
    total = 0
    deadline = time.perf_counter() + duration_s

    async def client(http: httpx.AsyncClient, index: int) -> None:
        nonlocal total
        n = 0
        while time.perf_counter() < deadline:
            ttft, count = await _stream(http, url, tokens, index * 1_000_000 + n)
            ttfts.append(ttft)
            total += count
            n += 1

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(http, i) for i in range(streams)))
    wall_s = time.perf_counter() - started
    cuts = statistics.quantiles(ttfts, n=100)
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
        "ttft_p99_ms": cuts[98] * 1e3,
        "output_tok_s": total / wall_s,
        "requests": len(ttfts),
    }


def interactive(server: Server, args: argparse.Namespace) -> Figures:
    return asyncio.run(_interactive(server, args.streams, args.interactive_tokens, args.duration))


def _answered(batch: Any) -> int:
    counts = batch.request_counts
    return 0 if counts is None else int(counts.completed + counts.failed)


def interactive_beside_a_batch(server: Server, upload_id: str, args: argparse.Namespace) -> Figures:
    """The interactive load while the batch runs: created first and under way (a result
    written) before the load starts; cancelled after it."""
    client = _client(server)
    batch_id = _created(client, upload_id)
    _wait(client, batch_id, lambda b: b.status in ENDED or _answered(b) > 0)
    before = _answered(client.batches.retrieve(batch_id))
    started = time.perf_counter()
    figures = interactive(server, args)
    during = _answered(client.batches.retrieve(batch_id)) - before
    wall_s = time.perf_counter() - started
    client.batches.cancel(batch_id)
    ended = _wait(client, batch_id, lambda b: b.status in ENDED)
    if during >= args.requests - before:
        print(f"the batch ended ({ended.status}) within the load: use more --requests")
    return {**figures, "batch_tok_s": during * args.tokens / wall_s}


def measure(args: argparse.Namespace, file: Path) -> Callable[[Server, Round], Figures]:
    def one_start(server: Server, round_: Round) -> Figures:
        server.warm(CHAT)
        client = _client(server)
        with file.open("rb") as data:
            upload_id = client.files.create(file=(file.name, data), purpose="batch").id
        return {
            "batch_alone": batch_alone(server, upload_id, args.requests),
            "interactive_alone": interactive(server, args),
            "interactive_with_batch": interactive_beside_a_batch(server, upload_id, args),
        }

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


def table(results: Results, args: argparse.Namespace, names: Sequence[str]) -> str:
    def med(target: str, *path: str) -> float:
        return statistics.median(results.per_round(target, *path))

    def ratio(a: str, b: str, target: str, key: str) -> float:
        return statistics.median(
            harness.ratios(results.per_round(target, a, key), results.per_round(target, b, key))
        )

    rows: list[list[object]] = []
    for name in names:
        alone, beside = "interactive_alone", "interactive_with_batch"
        rows.append(
            [
                name,
                f"{med(name, alone, 'ttft_p50_ms'):.0f} / {med(name, beside, 'ttft_p50_ms'):.0f}"
                f" (**{ratio(beside, alone, name, 'ttft_p50_ms'):.2f}x**)",
                f"{med(name, alone, 'ttft_p99_ms'):.0f} / {med(name, beside, 'ttft_p99_ms'):.0f}"
                f" (**{ratio(beside, alone, name, 'ttft_p99_ms'):.2f}x**)",
                f"{med(name, alone, 'output_tok_s'):.0f} / {med(name, beside, 'output_tok_s'):.0f}"
                f" (**{ratio(beside, alone, name, 'output_tok_s'):.2f}x**)",
                f"{med(name, beside, 'batch_tok_s'):.0f}",
            ]
        )
    alone_rows: list[list[object]] = []
    for name in [*names, RUN_BATCH]:
        tok_s = results.per_round(name, "batch_alone", "output_tok_s")
        versus = harness.ratios(tok_s, results.per_round(RUN_BATCH, "batch_alone", "output_tok_s"))
        alone_rows.append([name, harness.spread(tok_s), f"**{statistics.median(versus):.2f}x**"])
    return "\n".join(
        [
            f"Tiny model; a batch of {args.requests} chat completions of {args.tokens} tokens "
            f"(`ignore_eos`); interactive: {args.streams} clients streaming chats of "
            f"{args.interactive_tokens} tokens one after the other for {args.duration:.0f} s; "
            f"medians of {args.rounds} alternating round(s) (ratios round by round). "
            "Alone / with the batch running:",
            "",
            *markdown_table(
                [
                    "server",
                    "TTFT p50 ms",
                    "TTFT p99 ms",
                    "interactive tok/s",
                    "batch tok/s meanwhile",
                ],
                rows,
            ),
            "",
            "The batch alone on an idle server (Switchboard: create to completed; `vllm "
            "run-batch`: its runner, reading the file to writing the output):",
            "",
            *markdown_table(["runner", "output tok/s", "vs vllm run-batch"], alone_rows),
        ]
    )


def main() -> None:
    if sys.argv[1:2] == ["--run-batch-child"]:
        run_batch_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=64, help="a batch request's output")
    parser.add_argument("--streams", type=int, default=4, help="interactive clients")
    parser.add_argument("--interactive-tokens", type=int, default=32)
    parser.add_argument("--duration", type=float, default=20.0, help="s of interactive load")
    parser.add_argument(
        "--busy", type=int, nargs="+", default=[2, 0], help="--batch-busy-running values"
    )
    args = parser.parse_args()
    harness.tiny_model()
    work = Path(tempfile.mkdtemp(prefix="batches-"))
    file = batch_file(work / "in.jsonl", args.requests, args.tokens, "tiny")
    # Each target's batches on a store of its own: none left active by an earlier run.
    switchboards: Mapping[str, Target] = {
        f"switchboard busy={busy}": harness.switchboard(
            f"switchboard busy={busy}",
            *("--batch-busy-running", str(busy)),
            *("--batch-store", str(work / f"store-{busy}.sqlite3")),
        )
        for busy in args.busy
    }
    targets = [*switchboards.values(), run_batch_target(file, args.requests)]
    results = harness.run_rounds(targets, measure(args, file), rounds=args.rounds, name="batches")
    figures = {"settings": vars(args), **results.record()}
    publish("batches", figures, table(results, args, list(switchboards)))


if __name__ == "__main__":
    main()
