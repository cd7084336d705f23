"""Room for vLLM's engine core beside the frontend (issue 23): does giving the engine
core's threads a higher priority, or moving them onto the worker's core, make the
engine step faster beside Switchboard?

Why: the engine ITL column of bench/frontends.py shows the engine stepping slower beside
the Python frontends than beside the Rust one. On vLLM's CPU build the worker's OpenMP
thread is bound to core 0 and the engine core process (its busy loop: schedule, hand the
step to the worker, turn the output into messages) may run on either core; under load it
runs on core 1, beside the frontend, and takes about half of that core.

How: one `switchboard serve` (tiny model, as bench/frontends.py starts it), then runs in
turns, each variant in each turn, the order alternating: the engine core's threads as
vLLM leaves them, and changed (`--change nice`: nice -5; `--change core0`: affinity to
core 0 only), set before each run and undone after. Load: bench/sse_load.py, pinned to
core 0 at real-time priority, streamed completions of a 128-token-id prompt, 64 tokens
(`ignore_eos`), 64 streams, 1,024 requests a run. Figures per run: tok/s, the frontend's
CPU per token (Switchboard's process), TTFT p50, and the engine's mean inter-token
latency (vLLM's `vllm:inter_token_latency_seconds` around the run); the verdict is the
median of the changed/unchanged ratios within turns.

    .venv/bin/python bench/engine_thread.py [--turns 8] [--change nice core0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import sse_load
from common import markdown_table, publish, start_server, stop_server
from frontends import ENGINE_FLAGS, MODEL, PY, engine_itl, itl_mean_ms

PORT = 8161
C, REQUESTS, OUTPUT_LEN = 64, 1024, 64
PROMPT = list(range(10, 138))
NICE = -5
ALL_CORES = frozenset(os.sched_getaffinity(0))  # where vLLM leaves the engine core
Figures = dict[str, float]


def _engine_threads(server: int) -> list[int]:
    engine = next(
        p
        for p in psutil.Process(server).children(recursive=True)
        if p.name().startswith("VLLM::EngineCore")
    )
    return [t.id for t in engine.threads()]


def _nice(tid: int, on: bool) -> None:
    os.setpriority(os.PRIO_PROCESS, tid, NICE if on else 0)


def _core0(tid: int, on: bool) -> None:
    os.sched_setaffinity(tid, {0} if on else ALL_CORES)


CHANGES: dict[str, Callable[[int, bool], None]] = {"nice": _nice, "core0": _core0}


def _run(server: int, each: int) -> Figures:
    before = engine_itl(PORT)
    spec = sse_load.completions(PORT, "tiny", PROMPT, OUTPUT_LEN, C, each)
    m = sse_load.measure(spec, server)
    itl = itl_mean_ms(before, engine_itl(PORT))
    if itl is None:
        raise RuntimeError("the server timed no tokens (vllm:inter_token_latency_seconds)")
    m["engine_itl_ms"] = itl
    return m


def measure(change: str, turns: int) -> dict[str, list[Figures]]:
    command = [PY, "-m", "app.cli", "serve", "--model", str(MODEL), "--served-model-name"]
    command += ["tiny", "--port", str(PORT), "--log-level", "warning", *ENGINE_FLAGS]
    log = Path(tempfile.mkdtemp()) / "serve.log"
    proc = start_server(command, PORT, log)
    try:
        threads = _engine_threads(proc.pid)
        apply = CHANGES[change]
        _run(proc.pid, 2)  # warm-up
        runs: dict[str, list[Figures]] = {"as vLLM leaves it": [], change: []}
        for turn in range(turns):
            order = [False, True] if turn % 2 == 0 else [True, False]
            for on in order:
                for tid in threads:
                    apply(tid, on)
                m = _run(proc.pid, REQUESTS // C)
                runs[change if on else "as vLLM leaves it"].append(m)
                print(f"  turn {turn} {change if on else 'unchanged'}: {_line(m)}", flush=True)
        for tid in threads:
            apply(tid, False)
        return runs
    finally:
        stop_server(proc)


def _line(m: Figures) -> str:
    return (
        f"{m['output_tok_s']:.0f} tok/s, {m['frontend_cpu_us_per_tok']:.1f} us/tok, "
        f"TTFT p50 {m['ttft_p50_ms']:.1f} ms, engine ITL {m['engine_itl_ms']:.2f} ms"
    )


KEYS = ("output_tok_s", "frontend_cpu_us_per_tok", "ttft_p50_ms", "engine_itl_ms")


def table(raw: dict[str, dict[str, list[Figures]]], turns: int) -> str:
    head = (
        f"One `switchboard serve`, tiny model, {C} streams of {OUTPUT_LEN} tokens, {REQUESTS} "
        f"requests a run, {turns} turns; load bench/sse_load.py on core 0 (real-time). Each "
        "cell: the changed engine core over the unchanged, median of the ratios within turns "
        "(min-max)."
    )
    rows = []
    for change, runs in raw.items():
        base, changed = runs["as vLLM leaves it"], runs[change]
        cells = []
        for key in KEYS:
            ratios = [b[key] / a[key] for a, b in zip(base, changed, strict=True)]
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        rows.append([f"`{change}`", *cells])
    header = ["engine core's threads", "tok/s", "frontend CPU/token", "TTFT p50", "engine ITL"]
    return "\n".join([head, "", *markdown_table(header, rows)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--change", nargs="+", default=list(CHANGES), choices=CHANGES)
    args = parser.parse_args()
    raw: dict[str, Any] = {}
    for change in args.change:
        print(f"{change}:", flush=True)
        raw[change] = measure(change, args.turns)
    figures = {"turns": args.turns, "concurrency": C, "requests": REQUESTS, "raw": raw}
    publish("engine_thread", "engine_thread.json", figures, table(raw, args.turns))


if __name__ == "__main__":
    main()
