"""Per output token: Switchboard against vLLM's two OpenAI frontends (`vllm serve` in
Python, and its Rust frontend `vllm-rs`), above the bare engine and the transport's floor,
on the same machine and tiny model (issue 23).

Load: `vllm-rs bench serve`, vLLM's Rust load client (bench/vllm_rs.py fetches it):
streamed completions, random prompts of `INPUT_LEN` token ids (`--prompt-token-ids`: the
tiny tokenizer's text round trip does not converge), `OUTPUT_LEN` output tokens
(`--ignore-eos`), concurrency 1, 16 and 64. It spends ~8 us of CPU per token where the
aiohttp and vLLM Python clients spent as much as a frontend, and it runs pinned to core
0, beside the engine's OpenMP threads, so that it never shares the core vLLM's CPU
build leaves to the frontend (core 1): a client on the frontend's core tripled the
frontend's CPU per token (see git log), and a floating one made rounds differ 2x. On
core 0 it runs real-time (`chrt --fifo`): it needs ~2% of the core, and at normal
priority it read each stream in bursts behind the OpenMP threads.

Targets, one alive at a time, each started fresh per round and warmed:
- switchboard: `switchboard serve` as it starts by default (its frontend not pinned);
- switchboard pinned: `--pin-frontend true`, the frontend kept off the engine's core (the
  default until 2026-11-25, when runs named it "switchboard" and the default "switchboard
  unpinned": seven runs read no gain, see docs/benchmarks.md);
- vllm serve: `vllm serve` with its Python frontend (bench/vllm_serve.py launches vLLM's
  own command line on the CPU build);
- vllm serve (Rust): the same with `VLLM_USE_RUST_FRONTEND=1`: vLLM starts the engine
  core and `vllm-rs frontend`, which serves HTTP and talks to the engine core over ZMQ;
- bare engine: vLLM's `AsyncLLM` in process, no HTTP, the same prompts and concurrency
  from asyncio tasks, its frontend pinned as Switchboard's (the floor of any Python
  frontend built on vLLM's output processor);
- transport floor: bench/transport_floor.py's bare uvicorn SSE server (and its "ticks
  only" twin) streaming one 64-byte event per stream per tick to as many streams, the tick
  being the bare engine's median time per output token at that concurrency in the same
  round: what writing the events alone costs.

Frontend CPU per output token: user+sys CPU, over the load, of every process of the
server except the engine: the process tree under the launched server, less each process
whose title starts with `VLLM::` (vLLM titles its engine processes `VLLM::EngineCore` and
`VLLM::Worker`) and its descendants. For `vllm serve` that is its API server process; for
the Rust frontend the `vllm-rs frontend` process plus the Python supervisor above it; for
Switchboard its one process. The bare engine: its own process (os.times).

Rounds alternate the order of the targets; each figure is the median over rounds, with
its spread (min-max). At each round's start, `common.host_reference` times a fixed piece
of Python on the frontend's core: these VMs have run every target 1.5-2x slower for hours,
and the reference tells such a host from a slower change (the engine's own speed shows in
the bare engine's TPOT: on 2026-11-25 the Python was fast again while the engine still
stepped at half its speed). Writes bench/results/frontends.json (every round, the
machine, the load average, the host reference) and the table in docs/benchmarks.md
between the `bench:frontends` markers.

    .venv/bin/python bench/frontends.py [--rounds 5] [--targets ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from common import host_reference, markdown_table, publish, start_server, stop_server
from vllm_rs import vllm_rs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = ROOT / ".cache" / "tiny-model"
PY = sys.executable
INPUT_LEN, OUTPUT_LEN = 128, 64
PROMPTS = {1: 32, 16: 320, 64: 1024}  # concurrency -> requests per run
ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "1024"]
CLIENT_CORE = 0  # the engine's core: vLLM's CPU build leaves core 1 to the frontend
FRONTEND_CORE = 1
# The client runs real-time on that core: it needs ~2% of it, and at normal priority it
# waited behind the engine's OpenMP threads (TTFT p50 at c=1: 100-122 ms, 5-6 ms with it).
REALTIME = ["chrt", "--fifo", "10"]
SWITCHBOARD, PINNED = "switchboard", "switchboard pinned"
CHUNKED = "switchboard chunked"  # with the peers' chunked prefill (not the CPU default)
VLLM, RUST = "vllm serve", "vllm serve (Rust)"
BARE, FLOOR = "bare engine", "transport floor"
SERVERS = (SWITCHBOARD, PINNED, VLLM, RUST)
TARGETS = (*SERVERS, BARE)
ENGINE_TITLE = "VLLM::"

Figures = dict[str, float]


def server_command(target: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of a server target."""
    if target in (SWITCHBOARD, PINNED, CHUNKED):
        pin = ["--pin-frontend", "true"] if target == PINNED else []
        pin += ["--enable-chunked-prefill"] if target == CHUNKED else []
        command = [PY, "-m", "app.cli", "serve", "--model", str(MODEL)]
        command += ["--served-model-name", "tiny", "--port", str(port), "--log-level", "warning"]
        return [*command, *pin, *ENGINE_FLAGS], {}
    command = [PY, str(ROOT / "bench" / "vllm_serve.py"), "serve", str(MODEL)]
    command += ["--served-model-name", "tiny", "--port", str(port)]
    command += ["--disable-uvicorn-access-log", *ENGINE_FLAGS]
    if target == RUST:  # it refuses uvicorn's log level (it runs no uvicorn)
        return command, {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": str(vllm_rs())}
    return [*command, "--uvicorn-log-level", "warning"], {}


def _is_engine(process: psutil.Process) -> bool:
    try:
        return process.name().startswith(ENGINE_TITLE) or any(
            part.startswith(ENGINE_TITLE) for part in process.cmdline()[:1]
        )
    except psutil.Error:
        return False


def frontend_cpu(root: int) -> dict[int, float]:
    """User+sys CPU seconds of each process under `root` (itself included) that is not
    the engine (a `VLLM::` process or below one)."""
    seconds: dict[int, float] = {}
    pending = [psutil.Process(root)]
    while pending:
        process = pending.pop()
        if _is_engine(process):
            continue
        try:
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
            pending.extend(process.children())
        except psutil.Error:
            continue
    return seconds


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def bench_serve(port: int, concurrency: int, prompts: int, seed: int) -> dict[str, Any]:
    """One `vllm-rs bench serve` run on core `CLIENT_CORE`: its result JSON (a run
    whose requests did not all produce `OUTPUT_LEN` tokens is kept in /tmp and refused)."""
    with tempfile.TemporaryDirectory() as out:
        command = ["taskset", "-c", str(CLIENT_CORE), *REALTIME, str(vllm_rs()), "bench", "serve"]
        command += ["--backend", "openai", "--port", str(port), "--model", "tiny"]
        command += ["--tokenizer", str(MODEL), "--dataset-name", "random"]
        command += ["--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)]
        command += ["--prompt-token-ids", "--ignore-eos", "--max-concurrency", str(concurrency)]
        command += ["--num-prompts", str(prompts), "--seed", str(seed), "--disable-tqdm"]
        command += ["--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"]
        command += ["--save-result", "--save-detailed", "--result-dir", out]
        command += ["--result-filename", "r.json"]
        subprocess.run(command, check=True, capture_output=True, timeout=600)
        text = (Path(out) / "r.json").read_text()
    result: dict[str, Any] = json.loads(text)
    if result["completed"] != prompts or result["failed"]:
        kept = Path(tempfile.mkstemp(prefix="frontends-refused-", suffix=".json")[1])
        kept.write_text(text)
        raise RuntimeError(f"{result['completed']} of {prompts} requests completed; see {kept}")
    return result


def generated_tokens(port: int) -> float:
    """vLLM's own count of the tokens the engine generated (`vllm:generation_tokens_total`
    on /metrics, which all three servers serve). The load client counts a request's tokens
    from its usage chunk, but now and then (a request in ~1,000, on every server) misses
    it and counts chunks instead; the server's count is the truth."""
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    names = ("vllm:generation_tokens_total", "vllm:generation_tokens")  # Rust: either
    counts = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.split("{", 1)[0].split(" ", 1)[0] in names
    ]
    if not counts:
        raise RuntimeError(f"no vllm:generation_tokens_total on port {port}'s /metrics")
    return sum(counts)


ITL = "vllm:inter_token_latency_seconds"


def engine_itl(port: int) -> tuple[float, float]:
    """vLLM's inter-token latency histogram (sum, count) on /metrics, 0s where a server has
    none. Its times are the engine core's own (each step's output timestamp), so its mean
    over a run is the engine's step time as the requests saw it, whatever the frontend's
    delivery added on top."""
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    total = {"_sum": 0.0, "_count": 0.0}
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.startswith(ITL) and name[len(ITL) :] in total:
            total[name[len(ITL) :]] += float(line.split()[-1])
    return total["_sum"], total["_count"]


def itl_mean_ms(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The mean engine ITL between two `engine_itl` readings; None where no token was
    timed (a server that keeps no such histogram)."""
    count = after[1] - before[1]
    return (after[0] - before[0]) / count * 1e3 if count else None


def load_server(target: str, port: int, seeds: dict[int, int], log: Path) -> dict[int, Figures]:
    command, env = server_command(target, port)
    proc = start_server(command, port, log, env)
    try:
        # A fresh CPU engine's first request pays its warm-up, and each batch size its own
        # first step: a short run at the highest concurrency, unmeasured.
        httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4},
            timeout=300,
        )
        bench_serve(port, max(PROMPTS), max(PROMPTS), seed=10**6)
        out = {}
        for c, prompts in PROMPTS.items():
            generated = generated_tokens(port)
            itl_before = engine_itl(port)
            before = frontend_cpu(proc.pid)
            result = bench_serve(port, c, prompts, seeds[c])
            cpu = spent(before, frontend_cpu(proc.pid))
            tokens = generated_tokens(port) - generated
            itl = itl_mean_ms(itl_before, engine_itl(port))
            if tokens != prompts * OUTPUT_LEN:
                raise RuntimeError(f"{target}: {tokens:.0f} tokens from {prompts} requests")
            out[c] = {
                "output_tok_s": tokens / result["duration"],
                "ttft_p50_ms": result["median_ttft_ms"],
                "ttft_p99_ms": result["p99_ttft_ms"],
                "tpot_p50_ms": result["median_tpot_ms"],
                "itl_p50_ms": result["median_itl_ms"],
                "frontend_cpu_us_per_tok": cpu / tokens * 1e6,
                "frontend_cpu_s": cpu,
                "duration_s": result["duration"],
                "client_counted_tok": result["total_output_tokens"],
            }
            if itl is not None:  # a server that keeps no such histogram has no such figure
                out[c]["engine_itl_mean_ms"] = itl
            print(f"  {target} c={c}: {_line(out[c])}", flush=True)
        return out
    finally:
        stop_server(proc)


def _line(m: Figures) -> str:
    return (
        f"{m['output_tok_s']:.0f} tok/s, TTFT p50 {m['ttft_p50_ms']:.1f} ms, "
        f"TPOT p50 {m['tpot_p50_ms']:.2f} ms, engine ITL {m.get('engine_itl_mean_ms', 0):.2f} ms, "
        f"{m['frontend_cpu_us_per_tok']:.0f} us/tok"
    )


# -- the bare engine (a child process: one CPU engine at a time, and a clean heap) -------


def bare_engine_round(seeds: dict[int, int], log: Path) -> dict[int, Figures]:
    out = subprocess.run(
        [PY, __file__, "--bare-engine-child", json.dumps(seeds)],
        cwd=ROOT,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"bare engine run failed; see {log}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    results = {int(c): m for c, m in json.loads(line[len("RESULT ") :]).items()}
    for c, m in results.items():
        print(f"  {BARE} c={c}: {_line(m)}", flush=True)
    return results


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _bare_engine(seeds: dict[int, int]) -> dict[int, Figures]:
    """The same load on `AsyncLLM` directly: token-id prompts, deltas, no HTTP, no JSON."""
    import numpy as np
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.envs import enable_envs_cache
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from app.engine.cpu_host import pin_frontend

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(MODEL), dtype="float32", max_model_len=1024, enable_prefix_caching=True
        )
    )
    # As Switchboard does once its engine runs: its own core, vLLM's settings cached.
    pin_frontend()
    enable_envs_cache()
    vocab = llm.model_config.get_vocab_size()
    params = SamplingParams(
        max_tokens=OUTPUT_LEN, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )

    async def one(prompt: list[int], rid: str, ttfts: list[float], tpots: list[float]) -> int:
        start = time.perf_counter()
        first, count = 0.0, 0
        async for out in llm.generate(tokens_input(prompt), params, rid):
            if count == 0:
                first = time.perf_counter()
                ttfts.append(first - start)
            count += len(out.outputs[0].token_ids)
        if count > 1:
            tpots.append((time.perf_counter() - first) / (count - 1))
        return count

    async def run(c: int, prompts: int, seed: int) -> Figures:
        rng = np.random.default_rng(seed)
        ttfts: list[float] = []
        tpots: list[float] = []
        gate = asyncio.Semaphore(c)

        async def gated(i: int) -> int:
            prompt = rng.integers(10, vocab, INPUT_LEN).tolist()
            async with gate:
                return await one(prompt, f"s{seed}-{i}", ttfts, tpots)

        cpu, start = _own_cpu(), time.perf_counter()
        tokens = sum(await asyncio.gather(*(gated(i) for i in range(prompts))))
        elapsed, cpu = time.perf_counter() - start, _own_cpu() - cpu
        if tokens != prompts * OUTPUT_LEN:
            raise RuntimeError(f"{tokens} tokens from {prompts} requests")
        return {
            "output_tok_s": tokens / elapsed,
            "ttft_p50_ms": float(np.percentile(ttfts, 50) * 1000),
            "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1000),
            "tpot_p50_ms": float(np.percentile(tpots, 50) * 1000),
            "frontend_cpu_us_per_tok": cpu / tokens * 1e6,
            "frontend_cpu_s": cpu,
            "duration_s": elapsed,
        }

    await run(max(PROMPTS), max(PROMPTS), 10**6)  # warm-up, as the servers get
    results = {c: await run(c, n, seeds[c]) for c, n in PROMPTS.items()}
    llm.shutdown()
    return results


# -- the transport floor ----------------------------------------------------------------


def floor_round(bare: dict[int, Figures], log: Path) -> dict[int, Figures]:
    """bench/transport_floor.py's SSE and ticks-only servers, one stream per request of
    the load, ticking at the bare engine's time per output token of the same round."""
    out: dict[int, Figures] = {}
    for c in PROMPTS:
        tick_ms = bare[c]["tpot_p50_ms"]
        child = [PY, __file__, "--floor-child", str(c), str(tick_ms)]
        done = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, check=False)
        with log.open("a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"transport floor run failed; see {log}")
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
        out[c] = {"tick_ms": tick_ms, **json.loads(line[len("RESULT ") :])}
        print(
            f"  {FLOOR} c={c} (tick {tick_ms:.2f} ms): SSE {out[c]['sse_us_per_message']:.1f} "
            f"us/message, ticks only {out[c]['ticks_us_per_message']:.1f}",
            flush=True,
        )
    return out


def _floor_child(streams: int, tick_ms: float) -> dict[str, float]:
    import transport_floor

    os.sched_setaffinity(0, {transport_floor.CLIENT_CORE})
    messages = max(200, round(4000 / tick_ms))  # about 4 s a run
    sse = transport_floor.measure("SSE", streams, tick_ms / 1000, messages)
    ticks = transport_floor.measure(transport_floor.NONE, streams, tick_ms / 1000, messages)
    return {
        "sse_us_per_message": sse["cpu_us_per_message"],
        "sse_messages_per_s": sse["messages_per_s"],
        "ticks_us_per_message": ticks["cpu_us_per_message"],
    }


# -- the run ----------------------------------------------------------------------------


def spread(values: list[float], digits: int = 0) -> str:
    """The median, and the range over rounds when there are several."""
    med = statistics.median(values)
    if len(values) < 2:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _within(
    raw: dict[str, list[dict[int, Figures]]], a: str, b: str, c: int, key: str
) -> list[float]:
    """`a`'s figure over `b`'s, round by round."""
    return [x[c][key] / y[c][key] for x, y in zip(raw[a], raw[b], strict=True)]


def verdicts(raw: dict[str, list[dict[int, Figures]]]) -> list[str]:
    """Issue 23's goals, the floors under Switchboard, and the pinned frontend's verdict,
    each from ratios and differences taken within rounds."""
    cpu, speed = "frontend_cpu_us_per_tok", "output_tok_s"
    lines = []
    for c in PROMPTS:
        above = [
            s[c][cpu] - b[c][cpu] - f[c]["sse_us_per_message"]
            for s, b, f in zip(raw[SWITCHBOARD], raw[BARE], raw[FLOOR], strict=True)
        ]
        lines.append(
            f"- c={c}: Switchboard's CPU per token above the bare engine's and the SSE "
            f"floor's: {spread(above, 1)} us; pinned vs the default (unpinned): "
            f"{spread(_within(raw, PINNED, SWITCHBOARD, c, speed), 2)}x tok/s, "
            f"{spread(_within(raw, PINNED, SWITCHBOARD, c, cpu), 2)}x CPU/token, "
            f"{spread(_within(raw, PINNED, SWITCHBOARD, c, 'ttft_p50_ms'), 2)}x TTFT p50."
        )
    goals = [
        (64, speed, VLLM, ">=", 1.0),
        (64, speed, RUST, ">=", 1.0),
        (64, cpu, RUST, "<=", 1.0),
        (64, cpu, VLLM, "<=", 0.5),
        (16, cpu, RUST, "<=", 1.2),
    ]
    for c, key, peer, sense, bound in goals:
        ratio = statistics.median(_within(raw, SWITCHBOARD, peer, c, key))
        met = ratio >= bound if sense == ">=" else ratio <= bound
        what = "tok/s" if key == speed else "CPU/token"
        lines.append(
            f"- goal c={c} {what} {sense} {bound:g}x {peer}: {ratio:.2f}x, "
            f"{'met' if met else 'not met'}"
        )
    return lines


def _engine_itl(runs: list[Figures]) -> str:
    values = [m["engine_itl_mean_ms"] for m in runs if "engine_itl_mean_ms" in m]
    return spread(values, 2) if values else "-"


def table(raw: dict[str, list[dict[int, Figures]]], rounds: int, refs: list[float]) -> str:
    rows = []
    for c in PROMPTS:
        for target in TARGETS:
            runs = [r[c] for r in raw[target]]
            rows.append(
                [
                    c,
                    target,
                    spread([m["output_tok_s"] for m in runs]),
                    spread([m["ttft_p50_ms"] for m in runs], 1),
                    spread([m["tpot_p50_ms"] for m in runs], 2),
                    _engine_itl(runs),
                    spread([m["frontend_cpu_us_per_tok"] for m in runs]),
                ]
            )
        floors = [r[c] for r in raw[FLOOR]]
        sse = spread([m["sse_us_per_message"] for m in floors], 1)
        ticks = spread([m["ticks_us_per_message"] for m in floors], 1)
        rows.append([c, FLOOR, "-", "-", spread([m["tick_ms"] for m in floors], 2), "-", sse])
        rows.append([c, "(ticks only)", "-", "-", "-", "-", ticks])
        ratios = []
        for peer in (VLLM, RUST):
            ratio = [
                s[c]["frontend_cpu_us_per_tok"] / p[c]["frontend_cpu_us_per_tok"]
                for s, p in zip(raw[SWITCHBOARD], raw[peer], strict=True)
            ]
            speed = [
                s[c]["output_tok_s"] / p[c]["output_tok_s"]
                for s, p in zip(raw[SWITCHBOARD], raw[peer], strict=True)
            ]
            ratios.append(f"{spread(speed, 2)}x tok/s, {spread(ratio, 2)}x CPU of {peer}")
        rows.append([c, "**switchboard vs**", "; ".join(ratios), "", "", "", ""])
    head = (
        f"Tiny model, random {INPUT_LEN}-token prompts (token ids), {OUTPUT_LEN} output "
        "tokens (ignore_eos), streamed completions; load client `vllm-rs bench serve` on "
        f"core {CLIENT_CORE}; {', '.join(f'{n} requests at c={c}' for c, n in PROMPTS.items())}."
        f" Median of {rounds} alternating round(s) (min-max). Frontend CPU: user+sys of "
        "every server process but the engine's, per output token; the transport floor's: "
        "the bare SSE server's per event at the bare engine's time per token (TPOT column). "
        "Engine ITL: the mean of vLLM's `vllm:inter_token_latency_seconds` over the run, "
        "timed by the engine core's own step timestamps (- where a target keeps none)."
    )
    header = (
        "c",
        "target",
        "output tok/s",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "engine ITL ms",
        "frontend CPU us/tok",
    )
    host = (
        f"Host reference at each round's start, the Python speed of core {FRONTEND_CORE} "
        "(`common.host_reference`; 0.64-0.68 us in a fast hour of 2026-11-25, when the slow "
        "hours that day took 1.6-1.8x as long for a like piece of Python; the engine's speed "
        f"is the bare engine's TPOT): {', '.join(f'{x:.2f}' for x in refs)} us."
    )
    return "\n".join([head, "", *markdown_table(header, rows), "", *verdicts(raw), "", host])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=8141)
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=(*TARGETS, CHUNKED))
    parser.add_argument("--no-publish", action="store_true", help="print, write nothing")
    parser.add_argument("--bare-engine-child", metavar="SEEDS")
    parser.add_argument("--floor-child", nargs=2, metavar=("STREAMS", "TICK_MS"))
    args = parser.parse_args()
    if args.bare_engine_child:
        seeds = {int(c): s for c, s in json.loads(args.bare_engine_child).items()}
        print("RESULT " + json.dumps(asyncio.run(_bare_engine(seeds))), flush=True)
        return
    if args.floor_child:
        streams, tick_ms = int(args.floor_child[0]), float(args.floor_child[1])
        print("RESULT " + json.dumps(_floor_child(streams, tick_ms)), flush=True)
        return
    if not (MODEL / "config.json").is_file():
        subprocess.run([PY, "-m", "app.cli", "make-tiny-model", str(MODEL)], check=True, cwd=ROOT)
    vllm_rs()  # fetched before the first round, not inside one
    logs = Path(tempfile.mkdtemp(prefix="frontends-"))
    print(f"logs in {logs}", flush=True)
    raw: dict[str, list[dict[int, Figures]]] = {t: [] for t in (*args.targets, FLOOR)}
    loads: list[tuple[float, float, float]] = []
    refs: list[float] = []  # the host's speed at each round's start
    for r in range(args.rounds):
        n = len(args.targets)
        order = args.targets[r % n :] + args.targets[: r % n]
        # Rotated every round, reversed every odd round; not with two targets, where the
        # reversal undid the rotation (one order in every round).
        if r % 2 and n > 2:
            order.reverse()
        seeds = {c: 1000 * r + c for c in PROMPTS}  # one prompt set per round, every target
        loads.append(os.getloadavg())  # others' work on the machine shows here
        refs.append(host_reference(FRONTEND_CORE))  # a slow host shows here
        print(
            f"round {r}: {', '.join(order)}; load average {loads[-1]}; "
            f"host reference {refs[-1]:.2f} us",
            flush=True,
        )
        for target in order:
            log = logs / f"{target.replace(' ', '-')}-{r}.log"
            if target == BARE:
                raw[BARE].append(bare_engine_round(seeds, log))
                raw[FLOOR].append(floor_round(raw[BARE][-1], logs / f"floor-{r}.log"))
            else:
                raw[target].append(load_server(target, args.port, seeds, log))
            # What has run so far, should a later target fail or the run be stopped.
            (logs / "raw.json").write_text(
                json.dumps({"loads": loads, "host_reference_us": refs, "raw": raw})
            )
    print(f"logs in {logs}")
    if args.no_publish or set(args.targets) != set(TARGETS):
        print(json.dumps(raw, indent=1))
        return
    figures = {
        "rounds": args.rounds,
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "prompts": PROMPTS,
        "client_core": CLIENT_CORE,
        "load_average_at_each_round": loads,
        "host_reference_us_at_each_round": refs,
        "load_average_at_end": os.getloadavg(),
        "raw": raw,
    }
    publish("frontends", "frontends.json", figures, table(raw, args.rounds, refs))


if __name__ == "__main__":
    main()
