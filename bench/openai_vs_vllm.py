"""Switchboard vs `vllm serve` vs the bare engine, on the same machine and tiny model.

Load: vLLM's own `vllm bench serve` client (driven from Python, since the CPU build's
`vllm` command dies on its distribution name), random prompts of 128 tokens, 64 output
tokens, `ignore_eos`, concurrency 1, 16 and 32. The bare engine (AsyncLLM in process, no
HTTP) gets the same load shape and is the physical limit. Switchboard runs twice: as it
starts by default and with `--pin-frontend true` (its frontend pinned off the engine's
cores; the default until 2026-11-25, when runs named it "switchboard" and the other
"switchboard unpinned").

Beside tok/s and latencies: frontend CPU per output token, the server process's own
user+sys CPU time over the load (every thread; the engine-core child excluded), which is
far steadier than tok/s on a shared 2-core machine.

Two CPU engines alive at once slow each other, so exactly one runs at a time, and the
targets alternate A, B, C, A, B, C, ... over several rounds; the figures are medians over
rounds and the comparison is by ratios within the run. Writes bench/results/openai.json
and the table in docs/benchmarks.md between the `bench:openai` markers.

    .venv/bin/python bench/openai_vs_vllm.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import cpu_seconds, machine, start_server, stop_server, write_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = ROOT / ".cache" / "tiny-model"
PY = sys.executable
INPUT_LEN, OUTPUT_LEN = 128, 64
CONCURRENCY = {1: 16, 16: 96, 32: 128}  # concurrency -> number of prompts
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "1024"]
# The bare-engine child; servers get the same from common.start_server.
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
TARGETS = ("switchboard", "switchboard pinned", "vllm serve", "bare engine")


def server_command(target: str, port: int) -> list[str]:
    if target.startswith("switchboard"):
        pin = ["--pin-frontend", "true"] if target == "switchboard pinned" else []
        return [
            PY,
            "-m",
            "app.cli",
            "serve",
            "--model",
            str(MODEL),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *pin,
            *ENGINE_FLAGS,
        ]
    return [
        PY,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL),
        "--served-model-name",
        "tiny",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
        "warning",
        *ENGINE_FLAGS,
    ]


def warm_server(target: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = start_server(server_command(target, port), port, log)
    # The first request of a fresh CPU engine pays its warm-up; keep it out of the figures.
    httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": "tiny", "prompt": "warm up", "max_tokens": 8},
        timeout=300,
    )
    return proc


def bench_serve(port: int, concurrency: int, prompts: int, pid: int) -> dict[str, float]:
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend",
            "vllm",
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--model",
            "tiny",
            "--tokenizer",
            str(MODEL),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(INPUT_LEN),
            "--random-output-len",
            str(OUTPUT_LEN),
            "--ignore-eos",
            "--max-concurrency",
            str(concurrency),
            "--num-prompts",
            str(prompts),
            "--percentile-metrics",
            "ttft,itl",
            "--metric-percentiles",
            "50,99",
            "--seed",
            "0",
            "--disable-tqdm",
        ]
    )
    cpu = cpu_seconds(pid)
    result = asyncio.run(main_async(args))
    cpu = cpu_seconds(pid) - cpu
    return {
        "frontend_cpu_us_per_tok": cpu / result["total_output_tokens"] * 1e6,
        "output_tok_s": result["output_throughput"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"],
        "itl_p50_ms": result["median_itl_ms"],
    }


def bare_engine_round(log: Path) -> dict[int, dict[str, float]]:
    out = subprocess.run(
        [PY, __file__, "--bare-engine-child"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"bare engine run failed; see {log}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return {int(k): v for k, v in json.loads(line[len("RESULT ") :]).items()}


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _bare_engine() -> dict[int, dict[str, float]]:
    """The same load on AsyncLLM directly: no HTTP, no JSON, no SSE."""
    import numpy as np
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(MODEL), dtype="float32", max_model_len=1024, enable_prefix_caching=True
        )
    )
    vocab = llm.model_config.get_vocab_size()
    rng = np.random.default_rng(0)
    params = SamplingParams(
        max_tokens=OUTPUT_LEN, ignore_eos=True, temperature=1.0, output_kind=RequestOutputKind.DELTA
    )

    async def one(rid: str, ttfts: list[float], itls: list[float]) -> int:
        prompt = rng.integers(10, vocab, INPUT_LEN).tolist()
        start = last = time.perf_counter()
        count = 0
        async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), params, rid):
            now = time.perf_counter()
            if count == 0:
                ttfts.append(now - start)
            else:
                itls.append(now - last)
            last = now
            count += len(out.outputs[0].token_ids)
        return count

    await one("warm", [], [])
    results: dict[int, dict[str, float]] = {}
    for concurrency, prompts in CONCURRENCY.items():
        ttfts: list[float] = []
        itls: list[float] = []
        gate = asyncio.Semaphore(concurrency)

        async def gated(
            rid: str, gate: asyncio.Semaphore, ttfts: list[float], itls: list[float]
        ) -> int:
            async with gate:
                return await one(rid, ttfts, itls)

        cpu = _own_cpu()
        start = time.perf_counter()
        tokens = sum(
            await asyncio.gather(
                *[gated(f"c{concurrency}-{i}", gate, ttfts, itls) for i in range(prompts)]
            )
        )
        elapsed = time.perf_counter() - start
        results[concurrency] = {
            "frontend_cpu_us_per_tok": (_own_cpu() - cpu) / tokens * 1e6,
            "output_tok_s": tokens / elapsed,
            "ttft_p50_ms": float(np.percentile(ttfts, 50) * 1000),
            "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1000),
            "itl_p50_ms": float(np.percentile(itls, 50) * 1000),
        }
    llm.shutdown()
    return results


def median_of(rounds: list[dict[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    return {
        c: {m: statistics.median(r[c][m] for r in rounds) for m in rounds[0][c]}
        for c in CONCURRENCY
    }


def table(summary: dict[str, dict[int, dict[str, float]]], rounds: int) -> str:
    lines = [
        f"Tiny model, random {INPUT_LEN}-token prompts, {OUTPUT_LEN} output tokens, "
        f"ignore_eos; medians of {rounds} alternating rounds; ratio = Switchboard / peer.",
        "",
        "| concurrency | target | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
        "| frontend CPU us/tok |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in CONCURRENCY:
        for target in TARGETS:
            m = summary[target][c]
            lines.append(
                f"| {c} | {target} | {m['output_tok_s']:.0f} | {m['ttft_p50_ms']:.1f} | "
                f"{m['ttft_p99_ms']:.1f} | {m['itl_p50_ms']:.2f} | "
                f"{m['frontend_cpu_us_per_tok']:.0f} |"
            )
        sb, _, peer, bare = (summary[t][c] for t in TARGETS)
        lines.append(
            f"| {c} | **ratio** | **{sb['output_tok_s'] / peer['output_tok_s']:.2f}x peer, "
            f"{sb['output_tok_s'] / bare['output_tok_s']:.2f}x bare** | "
            f"{sb['ttft_p50_ms'] / peer['ttft_p50_ms']:.2f}x peer | | | "
            f"**{sb['frontend_cpu_us_per_tok'] / peer['frontend_cpu_us_per_tok']:.2f}x peer** |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--bare-engine-child", action="store_true")
    args = parser.parse_args()
    if args.bare_engine_child:
        print("RESULT " + json.dumps(asyncio.run(_bare_engine())), flush=True)
        return
    if not (MODEL / "config.json").is_file():
        subprocess.run([PY, "-m", "app.cli", "make-tiny-model", str(MODEL)], check=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw: dict[str, list[dict[int, dict[str, float]]]] = {t: [] for t in TARGETS}
    for r in range(args.rounds):
        for target in TARGETS:
            log = RESULTS / f"openai-{target.replace(' ', '-')}-{r}.log"
            if target == "bare engine":
                raw[target].append(bare_engine_round(log))
                continue
            proc = warm_server(target, args.port, log)
            try:
                raw[target].append(
                    {c: bench_serve(args.port, c, n, proc.pid) for c, n in CONCURRENCY.items()}
                )
            finally:
                stop_server(proc)
    summary = {t: median_of(raw[t]) for t in TARGETS}
    md = table(summary, args.rounds)
    (RESULTS / "openai.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "date": time.strftime("%Y-%m-%d"),
                "rounds": args.rounds,
                "input_len": INPUT_LEN,
                "output_len": OUTPUT_LEN,
                "median": summary,
                "raw": raw,
            },
            indent=2,
        )
    )
    write_table("openai", md)
    print(md)


if __name__ == "__main__":
    main()
