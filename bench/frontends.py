"""Per output token, and per start: Switchboard against vLLM's two OpenAI frontends (`vllm
serve` in Python, and its Rust frontend), above the bare engine and the transport's floor,
on the same machine and tiny model (issues 23 and 32).

Load: `vllm-rs bench serve`, vLLM's Rust load client (`harness.rust_load`, ~8 us of CPU a
token): streamed completions, random prompts of `INPUT_LEN` token ids, `OUTPUT_LEN` output
tokens (`ignore_eos`), at concurrency 1, 16 and 64. By default it runs where the kernel
puts it, as a client on the same host would (`--pinned-client`: on the engine's core at
real-time priority, where it never takes the frontend's core; the figures published
before 2026-11-26 were taken so): a server whose start falls into a slow mode must show
it here, so every target is started `--starts` times a round and every start is a row of
its own in the results; the table gives each server's slowest start against its median.
A start runs each concurrency `RUNS` times, its figures their medians, so that one run's
spread beside an unplaced client does not pass for the start's.

Targets, one alive at a time, each start fresh and warmed:
- switchboard: `switchboard serve` as it starts by default;
- switchboard, engine not niced: `--engine-niceness 0`, its engine's processes left at
  the frontend's priority (as every start was before issue 32; see docs/benchmarks.md);
- switchboard unpinned: `--pin-frontend false`, its frontend not kept off the
  engine's core;
- vllm serve: `vllm serve` with its Python frontend (bench/vllm_serve.py);
- vllm serve (Rust): the same with `VLLM_USE_RUST_FRONTEND=1`;
- bare engine: vLLM's `AsyncLLM` in process, no HTTP, the same prompts and concurrency
  from asyncio tasks (the floor of any Python frontend on vLLM's output processor);
- transport floor (measured with the bare engine): bench/transport_floor.py's bare
  uvicorn SSE server (and its "ticks only" twin) streaming one 64-byte event per stream
  per tick to as many streams, the tick being the bare engine's median time per output
  token at that concurrency in the same round: what writing the events alone costs.

Frontend CPU per output token: `harness.frontend_cpu` (every process of the server but
vLLM's engine) over the run, per token of vLLM's own count. Engine ITL: the mean of vLLM's
`vllm:inter_token_latency_seconds` over the run, the engine core's own step timestamps.
Writes bench/results/frontends.json and the table between the `bench:frontends` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/frontends.py \
        [--rounds 3] [--starts 2] [--targets ...] [--pinned-client] [--more RESULTS]

A run publishes when it measured Switchboard, both of vLLM's frontends and the bare engine.
Every start takes a minute or two: split a long run into runs short enough to hold the
engine lock for (`--no-publish` first, then `--more` the results.json it names, whose
rounds the next run continues).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import harness
from harness import (
    MODEL,
    PY,
    ROOT,
    Figures,
    Results,
    Round,
    Server,
    Target,
    markdown_table,
    publish,
    run_rounds,
    rust_load,
    spread,
    switchboard,
    vllm_serve,
)

INPUT_LEN, OUTPUT_LEN = 128, 64
PROMPTS = {1: 32, 16: 320, 64: 1024}  # concurrency -> requests per run
# Runs of each concurrency a start: its figures are their medians. One 3-second run beside
# a client the kernel places read as far apart within one start as between starts (5,522
# and 3,892 tok/s at 16 streams, frontends_starts_c16.json); a start slow for its life is
# slow in every run, and one slow run no longer decides a start.
RUNS = {1: 1, 16: 3, 64: 3}
SWITCHBOARD, UNPINNED = "switchboard", "switchboard unpinned"
UNNICED = "switchboard, engine not niced"  # --engine-niceness 0: as before issue 32
VLLM, RUST = "vllm serve", "vllm serve (Rust)"
BARE, FLOOR = "bare engine", "transport floor"
SERVERS = (SWITCHBOARD, UNNICED, VLLM, RUST)
STARTS_WITHIN = 0.8  # issue 32: every start within 0.8x of the median start's tok/s


def targets(names: list[str]) -> list[Target]:
    every = {
        SWITCHBOARD: lambda: switchboard(SWITCHBOARD),
        UNPINNED: lambda: switchboard(UNPINNED, "--pin-frontend", "false"),
        UNNICED: lambda: switchboard(UNNICED, "--engine-niceness", "0"),
        VLLM: lambda: vllm_serve(VLLM),
        RUST: lambda: vllm_serve(RUST, rust=True),
        BARE: lambda: Target(BARE, child=bare_engine_round),
    }
    return [every[name]() for name in names]


def measure(pinned: bool) -> Callable[[Server, Round], Figures]:
    def one_start(server: Server, round_: Round) -> Figures:
        server.warm()
        # Each batch size's first step on a fresh CPU engine is slow: one unmeasured run
        # at the highest concurrency.
        rust_load(server.port, max(PROMPTS), max(PROMPTS), 10**6, pinned=pinned)
        out: Figures = {}
        for c, prompts in PROMPTS.items():
            runs = []
            for run in range(RUNS[c]):
                with server.meter() as m:
                    seed = round_.seed(100 * run + c)
                    result = rust_load(server.port, c, prompts, seed, pinned=pinned)
                if m.tokens != result["completed"] * OUTPUT_LEN:
                    name = server.target.name
                    raise RuntimeError(f"{name}: {m.tokens:.0f} tokens, {prompts} asked")
                figures = {**m.figures(), **_latencies(result)}
                figures["output_tok_s"] = m.tokens / result["duration"]  # the client's clock
                figures["lost_to_keep_alive"] = prompts - result["completed"]
                print(f"  {server.target.name} c={c}: {_line(figures)}", flush=True)
                runs.append(figures)
            out[c] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            out[c]["runs"] = runs
        return out

    return one_start


def _latencies(result: Figures) -> Figures:
    return {
        "ttft_p50_ms": result["median_ttft_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"],
        "tpot_p50_ms": result["median_tpot_ms"],
        "itl_p50_ms": result["median_itl_ms"],
    }


def _line(m: Figures) -> str:
    return (
        f"{m['output_tok_s']:.0f} tok/s, TTFT p50 {m['ttft_p50_ms']:.1f} ms, "
        f"TPOT p50 {m['tpot_p50_ms']:.2f} ms, engine ITL {m.get('engine_itl_mean_ms', 0):.2f} ms, "
        f"{m['frontend_cpu_us_per_tok']:.0f} us/tok"
    )


# -- the bare engine and the floor (children: one CPU engine at a time, a clean heap) -----


def bare_engine_round(round_: Round, log: Path) -> Figures:
    """The bare engine's figures by concurrency, and under `FLOOR` the transport floor's at
    the bare engine's time per token."""
    seeds = {c: round_.seed(c) for c in PROMPTS}
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
    figures: Figures = json.loads(_result_line(out.stdout))
    for c, m in figures.items():
        print(f"  {BARE} c={c}: {_line(m)}", flush=True)
    figures[FLOOR] = floor_round(figures, log)
    return figures


def _result_line(stdout: str) -> str:
    return [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT ") :]


async def _bare_engine(seeds: dict[int, int]) -> dict[int, Figures]:
    """The same load on `AsyncLLM` directly: token-id prompts, deltas, no HTTP, no JSON."""
    import numpy as np
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.envs import enable_envs_cache
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(MODEL), dtype="float32", max_model_len=1024, enable_prefix_caching=True
        )
    )
    enable_envs_cache()  # as Switchboard does once its engine runs
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

        cpu, start = harness.own_cpu(), time.perf_counter()
        tokens = sum(await asyncio.gather(*(gated(i) for i in range(prompts))))
        elapsed, cpu = time.perf_counter() - start, harness.own_cpu() - cpu
        if tokens != prompts * OUTPUT_LEN:
            raise RuntimeError(f"{tokens} tokens from {prompts} requests")
        return {
            "output_tok_s": tokens / elapsed,
            "ttft_p50_ms": float(np.percentile(ttfts, 50) * 1000),
            "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1000),
            "tpot_p50_ms": float(np.percentile(tpots, 50) * 1000),
            "frontend_cpu_us_per_tok": cpu / tokens * 1e6,
            "frontend_cpu_s": cpu,
            "wall_s": elapsed,
        }

    await run(max(PROMPTS), max(PROMPTS), 10**6)  # warm-up, as the servers get
    results = {c: await run(c, n, seeds[c]) for c, n in PROMPTS.items()}
    llm.shutdown()
    return results


def floor_round(bare: Figures, log: Path) -> Figures:
    """bench/transport_floor.py's SSE and ticks-only servers, one stream per request of
    the load, ticking at the bare engine's time per output token of the same round."""
    out: Figures = {}
    for c in PROMPTS:
        tick_ms = bare[str(c)]["tpot_p50_ms"]
        child = [PY, __file__, "--floor-child", str(c), str(tick_ms)]
        done = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, check=False)
        with log.open("a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"transport floor run failed; see {log}")
        out[str(c)] = {"tick_ms": tick_ms, **json.loads(_result_line(done.stdout))}
        print(
            f"  {FLOOR} c={c} (tick {tick_ms:.2f} ms): SSE "
            f"{out[str(c)]['sse_us_per_message']:.1f} us/message, ticks only "
            f"{out[str(c)]['ticks_us_per_message']:.1f}",
            flush=True,
        )
    return out


def _floor_child(streams: int, tick_ms: float) -> Figures:
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


# -- the table ----------------------------------------------------------------------------

CPU, SPEED = "frontend_cpu_us_per_tok", "output_tok_s"


def starts_line(results: Results, target: str, c: int) -> str:
    """`target`'s slowest start at `c` against its median start (issue 32's goal: every
    start within 0.8x)."""
    speeds = results.each(target, c, SPEED)
    worst = min(speeds) / statistics.median(speeds)
    verdict = "met" if worst >= STARTS_WITHIN else "not met"
    starts = []
    for start in _starts(results, target):
        figures = start[str(c)] if str(c) in start else start[c]
        runs = figures.get("runs", [])
        each = f" ({', '.join(f'{run[SPEED]:.0f}' for run in runs)})" if len(runs) > 1 else ""
        starts.append(f"{figures[SPEED]:.0f}{each}")
    return (
        f"{target}: {len(speeds)} starts, {', '.join(starts)} tok/s; "
        f"slowest {worst:.2f}x the median ({verdict})"
    )


def verdicts(results: Results) -> list[str]:
    """Issue 32's goals and the floors under Switchboard, from ratios within rounds."""
    lines = []
    have = set(results.raw)
    if {SWITCHBOARD, BARE} <= have:
        for c in PROMPTS:
            above = [
                s - b - f
                for s, b, f in zip(
                    results.per_round(SWITCHBOARD, c, CPU),
                    results.per_round(BARE, c, CPU),
                    results.per_round(BARE, FLOOR, c, "sse_us_per_message"),
                    strict=True,
                )
            ]
            lines.append(
                f"- c={c}: Switchboard's CPU per token above the bare engine's and the SSE "
                f"floor's: {spread(above, 1)} us."
            )
    if {SWITCHBOARD, UNNICED} <= have:
        for c in (16, 64):
            lines.append(
                f"- c={c}: the engine niced (the default) over not: "
                f"{spread(results.within(SWITCHBOARD, UNNICED, c, SPEED), 2)}x tok/s, "
                f"{spread(results.within(SWITCHBOARD, UNNICED, c, CPU), 2)}x frontend CPU/token."
            )
    goals = [
        (64, CPU, VLLM, "<=", 0.6),
        (64, SPEED, VLLM, ">=", 1.0),
        (64, SPEED, RUST, ">=", 1.0),
        (16, CPU, VLLM, "<=", 0.6),
    ]
    for c, key, peer, sense, bound in goals:
        if {SWITCHBOARD, peer} <= have:
            ratio = statistics.median(results.within(SWITCHBOARD, peer, c, key))
            met = ratio >= bound if sense == ">=" else ratio <= bound
            what = "tok/s" if key == SPEED else "CPU/token"
            lines.append(
                f"- goal c={c} {what} {sense} {bound:g}x {peer}: {ratio:.2f}x, "
                f"{'met' if met else 'not met'}"
            )
    return lines


def table(results: Results, args: argparse.Namespace) -> str:
    rows = []
    for c in PROMPTS:
        for target in results.raw:
            figures = [f[str(c)] if str(c) in f else f[c] for f in _starts(results, target)]
            itl = [m["engine_itl_mean_ms"] for m in figures if "engine_itl_mean_ms" in m]
            rows.append(
                [
                    c,
                    target,
                    spread([m[SPEED] for m in figures]),
                    spread([m["ttft_p50_ms"] for m in figures], 1),
                    spread([m["tpot_p50_ms"] for m in figures], 2),
                    spread(itl, 2) if itl else "-",
                    spread([m[CPU] for m in figures]),
                ]
            )
        if BARE in results.raw:
            floors = results.each(BARE, FLOOR, c, "sse_us_per_message")
            ticks = results.each(BARE, FLOOR, c, "ticks_us_per_message")
            tick = results.each(BARE, FLOOR, c, "tick_ms")
            rows.append([c, FLOOR, "-", "-", spread(tick, 2), "-", spread(floors, 1)])
            rows.append([c, "(ticks only)", "-", "-", "-", "-", spread(ticks, 1)])
        ratios = [
            f"{spread(results.within(SWITCHBOARD, peer, c, SPEED), 2)}x tok/s, "
            f"{spread(results.within(SWITCHBOARD, peer, c, CPU), 2)}x CPU of {peer}"
            for peer in (VLLM, RUST)
            if {SWITCHBOARD, peer} <= set(results.raw)
        ]
        if ratios:
            rows.append([c, "**switchboard vs**", "; ".join(ratios), "", "", "", ""])
    client = (
        f"pinned to core {harness.CLIENT_CORE} at real-time priority"
        if args.pinned_client
        else "where the kernel puts it (not pinned)"
    )
    head = (
        f"Tiny model, random {INPUT_LEN}-token prompts (token ids), {OUTPUT_LEN} output "
        f"tokens (ignore_eos), streamed completions; load client `vllm-rs bench serve` "
        f"{client}; {', '.join(f'{n} requests at c={c}' for c, n in PROMPTS.items())}; "
        f"{_runs()} a start, its figures their medians. {args.rounds} alternating round(s) "
        f"of {args.starts} fresh start(s) of each target: the median over every start "
        "(min-max). Frontend CPU: user+sys of every server "
        "process but the engine's, per output token; the transport floor's: the bare SSE "
        "server's per event at the bare engine's time per token (TPOT column). Engine ITL: "
        "the mean of vLLM's `vllm:inter_token_latency_seconds` over the run, the engine "
        "core's own step timestamps (- where a target keeps none)."
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
    starts = [
        f"- c={c} {starts_line(results, target, c)}"
        for c in (16, 64)
        for target in results.raw
        if target != BARE
    ]
    refs = ", ".join(f"{r.host_reference_us:.2f}" for r in results.rounds)
    loads = ", ".join(f"{r.load_average[0]:.1f}" for r in results.rounds)
    host = (
        f"Host reference at each round's start, the Python speed of core "
        f"{harness.FRONTEND_CORE} (`harness.host_reference`; 0.64-0.68 us in a fast hour): "
        f"{refs} us; load average (1 min): {loads}."
    )
    return "\n".join(
        [
            head,
            "",
            *markdown_table(header, rows),
            "",
            "Every start (each server's tok/s, start by start; its runs in parentheses):",
            "",
            *starts,
            "",
            *verdicts(results),
            "",
            host,
        ]
    )


def _runs() -> str:
    return ", ".join(f"{n} run{'s' * (n > 1)} at c={c}" for c, n in RUNS.items())


def _starts(results: Results, target: str) -> list[Figures]:
    return [f for starts in results.raw[target] for f in starts]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=2, help="fresh starts per target a round")
    parser.add_argument(
        "--targets", nargs="+", default=[*SERVERS, BARE], choices=[*SERVERS, UNPINNED, BARE]
    )
    parser.add_argument("--pinned-client", action="store_true")
    parser.add_argument("--no-publish", action="store_true", help="print, write nothing")
    parser.add_argument(
        "--more", type=Path, metavar="RESULTS", help="continue the rounds of this results file"
    )
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
    harness.tiny_model()
    earlier = Results.from_record(json.loads(args.more.read_text())) if args.more else None
    if earlier is not None:
        args.targets = list(earlier.raw)
    results = run_rounds(
        targets(args.targets),
        measure(args.pinned_client),
        rounds=args.rounds,
        starts=args.starts,
        name="frontends",
        earlier=earlier,
    )
    args.rounds = len(results.rounds)
    figures = {
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "prompts": PROMPTS,
        "runs_per_start": RUNS,
        "starts": args.starts,
        "client": "pinned" if args.pinned_client else "unpinned",
        **results.record(),
    }
    if args.no_publish or not {SWITCHBOARD, VLLM, RUST, BARE} <= set(args.targets):
        print(table(results, args))
        print(json.dumps(figures))
        return
    publish("frontends", figures, table(results, args))


if __name__ == "__main__":
    main()
