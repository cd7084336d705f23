"""Switchboard's own CPU per streamed token, with vLLM's engine taken out: a measurement
that holds on a busy machine (issue 23, phase 2).

The server is the real app, served as `switchboard serve` serves it (`start_engine`,
`create_app`, `freeze_startup_heap`, uvicorn with `app.cli.uvicorn_config`, uvloop), on a
real socket, in a process pinned to core 1; under its real `VllmEngine` sits an engine
double (bench/engine_double.py) whose one shared clock steps every active request like
an engine step. Two depths of double, two targets:

- `switchboard`: `StubLLM` in place of `AsyncLLM` (RequestOutput deltas through vLLM's
  per-request collector; no detokenizer, no stats): VllmEngine.generate, the event
  converter, admission, merge, the protocol core, SSE, the middleware and uvicorn run as
  in production, and above them nothing of vLLM's output path;
- `switchboard + vLLM output path`: a real `AsyncLLM` on `StubEngineCore`: vLLM's output
  handler, `OutputProcessor` (detokenizer, RequestOutputs, collectors), IterationStats and
  the stat loggers (the EPP gauges) run too; only the engine core process is gone.

Beside each, the same double consumed in process by bare `async for` loops (`bare stub`,
`bare AsyncLLM`: one task per request, no HTTP, no JSON), pinned alike: what is left of a
server's figure above its bare twin is Switchboard's own. And, for the leaner consumer
of the engine core's outputs issue 23 proposes: `lean consumer`, one loop per step over
`StubEngineCore`'s outputs doing what must stay exactly vLLM's (the detokenizer, the
IterationStats and the stat loggers, through vLLM's own `OutputProcessor` request
states) and handing each request its text without a `RequestOutput`, a queue or a task
wake-up; `step loop`, the stepper's outputs read and dropped (the floor of any consumer).

Load: bench/sse_load.py (raw bytes, uvloop, pinned to core 0 at real-time priority), `c`
keep-alive connections each sending its requests one after another: streamed
completions of a 128-token-id prompt or chats of one short message, `max_tokens` 64,
`ignore_eos`, `include_usage`; every stream checked (a 200, no error, the usage's token
count), so every run costs the same work.

Figure: the process's user+sys CPU (/proc/PID/stat) over a run, per output token. Why it
holds on a busy machine: CPU time counts only the time the process runs, the work is the
same event for event, and no engine's speed or batching enters it (the double steps
every `--period-ms` on the server's own loop: a server slower than that, on a shared
core, runs its steps back to back, the same work). What contention still moves (caches,
frequency) moves every target of a round alike: rounds alternate the targets' order,
and the table gives medians and ranges. Instruction counts would be steadier still, but
`perf stat -e instructions` reads `<not supported>` in this VM (no PMU).

A/B of the server itself: `--trees NAME=PATH ...` runs the switchboard targets once per
source tree (PYTHONPATH=PATH), alternating within each round: how each change was
measured; `--targets "VllmEngine.generate"` A/Bs the engine seam alone (a task per
request iterating `VllmEngine.generate` over vLLM's output path, no HTTP) and
`--concurrency` narrows the runs. `--deltas-ab TURNS` measures the seam's two output
paths (app.engine.vllm.deltas) in turns inside one process, where nothing else differs
(bench/results/per_token_deltas.json, the `bench:deltas` table). `--split` fits what a
server spends per request and per token, from streams of two lengths in alternating runs
(bench/results/per_token_split.json, the `bench:split` table). Without these, the run
publishes bench/results/per_token.json and the table between the `bench:per_token`
markers, with the load average. In-process targets freeze their start-up heap as the
servers do.

    PYTHONPATH=$PWD .venv/bin/python bench/per_token.py [--rounds 5] [--apis completions chat]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sse_load
from common import markdown_table, publish, stop_server, write_table

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".cache" / "tiny-model"
SERVER_CORE, CLIENT_CORE = 1, 0
PROMPT_LEN, OUTPUT_LEN = 128, 64
CONCURRENCY = (1, 16, 64)
REQUESTS = {1: 40, 16: 320, 64: 768}  # per run: 2,560, 20,480 and 49,152 tokens
PERIOD_MS = {1: 1.0, 16: 3.0, 64: 8.0}  # the double's step: ~the tiny model's on an idle core
APIS = ("completions", "chat")
STUB, VLLM_PATH = "switchboard", "switchboard + vLLM output path"
BARE_STUB, BARE_VLLM = "bare stub", "bare AsyncLLM"
LEAN, STEPS = "lean consumer", "step loop"
SEAM = "VllmEngine.generate"
DELTAS_AB = "deltas-ab"  # SEAM in one process, its two output paths in turns
SERVERS = {STUB: "stub", VLLM_PATH: "vllm"}
IN_PROCESS = (BARE_STUB, BARE_VLLM, LEAN, STEPS)
PER_TREE = (*SERVERS, SEAM)  # targets that run Switchboard's own code: A/B'd per tree
SPLIT_C, SPLIT_LENS, SPLIT_TOKENS = 64, (16, 64), 49_152  # --split

Figures = dict[str, float]


# -- the engine under test, as `switchboard serve` starts it ------------------------------


def _settings(port: int) -> Any:
    from app.config import Settings

    return Settings(
        model=str(MODEL),
        served_model_name="tiny",
        port=port,
        grpc_port=0,  # HTTP only: and two servers can be alive at once
        log_level="warning",
        engine_args={"dtype": "float32", "max_model_len": 1024},
    )


async def _engine(depth: str, port: int) -> tuple[Any, Any]:
    """The real `VllmEngine` over the double `depth` ("stub" or "vllm"), and its stepper."""
    from engine_double import Stepper, StubLLM, install_stub_core, text_tokens

    from app.engine.vllm.startup import start_engine

    stepper = Stepper(PERIOD_MS[1] / 1000, [])
    # AsyncLLM's output handler (started with it) reads its engine core's steps: under
    # StubLLM, from a stepper of its own that never has a request.
    install_stub_core(stepper if depth == "vllm" else Stepper(1.0, []))
    engine = await start_engine(_settings(port))
    stepper.tokens = text_tokens(engine._llm.get_tokenizer())
    if depth == "stub":
        # Below the real VllmEngine, in place of its AsyncLLM (a bench's liberty).
        engine._llm = StubLLM(engine._llm, stepper)
        engine._deltas = False  # its outputs come as RequestOutputs, from StubLLM
    return engine, stepper


def _follow_periods(stepper: Any, loop: asyncio.AbstractEventLoop) -> None:
    """The parent sets the step period per run, one `period MS` line on stdin each."""

    def read() -> None:
        for line in sys.stdin:
            ms = float(line.split()[1])
            loop.call_soon_threadsafe(setattr, stepper, "period_s", ms / 1000)

    threading.Thread(target=read, daemon=True).start()


async def _serve(depth: str, port: int) -> None:
    import uvicorn

    from app.cli import uvicorn_config
    from app.engine.vllm.startup import freeze_startup_heap
    from app.main import create_app

    engine, stepper = await _engine(depth, port)
    settings = _settings(port)
    app = create_app(settings, engine=engine)
    freeze_startup_heap()
    _follow_periods(stepper, asyncio.get_running_loop())
    try:
        await uvicorn.Server(uvicorn_config(app, settings)).serve()
    finally:
        engine.shutdown()


# -- the same doubles consumed in process --------------------------------------------------


async def _in_process(target: str, counts: dict[int, int]) -> dict[int, Figures]:
    """CPU per token of `target` (one of IN_PROCESS), per concurrency."""
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind

    from app.engine.base import GenerationRequest, SamplingOptions
    from app.engine.vllm.startup import freeze_startup_heap

    engine, stepper = await _engine("stub" if target == BARE_STUB else "vllm", 0)
    freeze_startup_heap()  # as the servers do: no collection walks vLLM's start-up heap
    llm = engine._llm
    params = SamplingParams(
        max_tokens=OUTPUT_LEN, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    prompt = list(range(10, 10 + PROMPT_LEN))
    serial = iter(range(10**9))

    async def client(requests: int) -> int:
        tokens = 0
        for _ in range(requests):
            stream = llm.generate(tokens_input(prompt), params, f"r{next(serial)}")
            async for out in stream:
                tokens += len(out.outputs[0].token_ids)
        return tokens

    async def seam_client(requests: int) -> int:
        tokens = 0
        for _ in range(requests):
            options = SamplingOptions(max_tokens=OUTPUT_LEN, ignore_eos=True)
            rid = f"s{next(serial)}"
            request = GenerationRequest(rid, prompt_token_ids=prompt, sampling=options)
            async for event in engine.generate(request):
                tokens += len(event.token_ids)
        return tokens

    async def run(c: int, requests: int) -> int:
        if target in (LEAN, STEPS):
            return await _step_consumer(llm, stepper, target == LEAN, c, requests, prompt)
        shares = [requests // c + (i < requests % c) for i in range(c)]
        each = seam_client if target == SEAM else client
        return sum(await asyncio.gather(*(each(n) for n in shares)))

    await run(max(counts), counts[max(counts)])  # warm-up, as the servers get
    if target == DELTAS_AB:
        return await _deltas_turns(engine, stepper, run, counts)
    out = {}
    for c, requests in counts.items():
        stepper.period_s = PERIOD_MS[c] / 1000
        before, start = _own_cpu(), time.perf_counter()
        tokens = await run(c, requests)
        cpu, wall = _own_cpu() - before, time.perf_counter() - start
        if tokens != requests * OUTPUT_LEN:
            raise RuntimeError(f"{target}: {tokens} tokens from {requests} requests")
        out[c] = {"cpu_us_per_token": cpu / tokens * 1e6, "tokens": tokens, "wall_s": wall}
    engine.shutdown()
    return out


async def _step_consumer(
    llm: Any, stepper: Any, lean: bool, c: int, requests: int, prompt: list[int]
) -> int:
    """`requests` requests, `c` at a time, consumed one engine step at a time by one loop
    (no RequestOutput, collector or per-request task). `lean`: through vLLM's own request
    states, so the detokenizer, IterationStats and the stat loggers run exactly as
    AsyncLLM's output handler runs them; else the outputs are read and dropped."""
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.metrics.stats import IterationStats

    processor, core = llm.output_processor, llm.engine_core
    if llm.output_handler is not None:  # this loop takes its place
        llm.output_handler.cancel()
        llm.output_handler = None
    params = SamplingParams(
        max_tokens=OUTPUT_LEN, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    texts: dict[str, list[str]] = {}
    started = done = tokens = 0

    async def add() -> None:
        nonlocal started
        request_id = f"lean{started}-{time.monotonic_ns()}"
        started += 1
        if lean:
            request = llm.input_processor.process_inputs(
                request_id, tokens_input(prompt), params, supported_tasks=("generate",)
            )
            llm.input_processor.assign_request_id(request)
            processor.add_request(request, None, None, 0, None)
            await core.add_request_async(request)
            texts[request.request_id] = []
        else:
            stepper.add(request_id, OUTPUT_LEN, len(prompt))

    for _ in range(min(c, requests)):
        await add()
    while done < requests:
        outputs = await core.get_output_async()
        stats = IterationStats() if lean else None
        for output in outputs.outputs:
            tokens += len(output.new_token_ids)
            finished = output.finish_reason is not None
            if lean:
                state = processor.request_states[output.request_id]
                processor._update_stats_from_output(state, output, outputs.timestamp, stats)
                state.is_prefilling = False
                state.detokenizer.update(output.new_token_ids, False)
                texts[output.request_id].append(
                    state.detokenizer.get_next_output_text(finished, True)
                )
                if finished:
                    processor._finish_request(state)
                    processor._update_stats_from_finished(state, output.finish_reason, stats)
                    del texts[output.request_id]
            if finished:
                done += 1
                if started < requests:
                    await add()
        if lean:
            processor.update_scheduler_stats(outputs.scheduler_stats)
            llm.logger_manager.record(
                engine_idx=0, scheduler_stats=outputs.scheduler_stats, iteration_stats=stats
            )
    return tokens


async def _deltas_turns(engine: Any, stepper: Any, run: Any, counts: dict[int, int]) -> Any:
    """`VllmEngine.generate` over vLLM's output path, its outputs taken as deltas or as
    `RequestOutput`s (app.engine.vllm.deltas) in turns, in one process: one heap, one
    engine, so what moves a process's CPU from one start to the next cancels out."""
    turns: list[dict[str, dict[int, float]]] = []
    for turn in range(int(os.environ["DELTAS_AB_TURNS"])):
        figures: dict[str, dict[int, float]] = {}
        for deltas in (True, False) if turn % 2 == 0 else (False, True):
            engine._deltas = deltas
            by_c = figures.setdefault("deltas" if deltas else "request outputs", {})
            for c, requests in counts.items():
                stepper.period_s = PERIOD_MS[c] / 1000
                before = _own_cpu()
                tokens = await run(c, requests)
                by_c[c] = (_own_cpu() - before) / tokens * 1e6
        turns.append(figures)
    return turns


def deltas_table(turns: list[dict[str, dict[str, float]]]) -> str:
    rows = []
    for c in turns[0]["deltas"]:
        on = [t["deltas"][c] for t in turns]
        off = [t["request outputs"][c] for t in turns]
        ratio = [a / b for a, b in zip(on, off, strict=True)]
        saved = [b - a for a, b in zip(on, off, strict=True)]
        lower = sum(r < 1 for r in ratio)
        rows.append([c, spread(off), spread(on), spread(ratio, 2), spread(saved), lower])
    header = (
        "c",
        "RequestOutputs: CPU us/token",
        "deltas: CPU us/token",
        "ratio",
        "saved us/token",
        f"turns cheaper (of {len(turns)})",
    )
    head = (
        f"`VllmEngine.generate` consumed in process ({OUTPUT_LEN} tokens per request, "
        f"{PROMPT_LEN}-token prompts) over a real AsyncLLM on the stub engine core, one "
        "process pinned to core 1, the two output paths in alternating turns; medians "
        "(min-max) over the turns, ratios and savings turn by turn."
    )
    return "\n".join([head, "", *markdown_table(header, rows)])


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


# -- the load: bench/sse_load.py, pinned to the engine's core ------------------------------


def _spec(
    api: str, port: int, c: int, requests: int, output_len: int = OUTPUT_LEN
) -> sse_load.Spec:
    if api == "completions":
        prompt = list(range(10, 10 + PROMPT_LEN))
        return sse_load.completions(port, "tiny", prompt, output_len, c, max(1, requests // c))
    prompt_text = "Say something about the sea."
    return sse_load.chat(port, "tiny", prompt_text, output_len, c, max(1, requests // c))


# -- running the targets ------------------------------------------------------------------


def _child(args: list[str], tree: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = ["taskset", "-c", str(SERVER_CORE), sys.executable, __file__, *args]
    return subprocess.Popen(
        command,
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _wait_listening(port: int, proc: subprocess.Popen[str]) -> None:
    import socket

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited at start ({proc.returncode})")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError("the server did not start")


def measure_server(
    depth: str, tree: Path, port: int, apis: list[str], counts: dict[int, int]
) -> dict[str, dict[int, Figures]]:
    """One fresh server over the double `depth`: CPU per token per API and concurrency."""
    import socket

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is already served (an orphan server?)")
    proc = _child(["--serve", depth, str(port)], tree)
    try:
        _wait_listening(port, proc)
        assert proc.stdin is not None

        def period(c: int) -> None:
            assert proc.stdin is not None
            proc.stdin.write(f"period {PERIOD_MS[c]}\n")
            proc.stdin.flush()

        out: dict[str, dict[int, Figures]] = {}
        for api in apis:
            top = max(counts)
            period(top)
            sse_load.measure(_spec(api, port, top, counts[top]), proc.pid)  # warm-up
            out[api] = {}
            for c, requests in counts.items():
                period(c)
                time.sleep(0.05)
                m = sse_load.measure(_spec(api, port, c, requests), proc.pid)
                out[api][c] = {
                    "cpu_us_per_token": m[sse_load.CPU],
                    "tokens": c * max(1, requests // c) * OUTPUT_LEN,
                    "wall_s": m["wall_s"],
                }
        return out
    finally:
        stop_server(proc)


def measure_split(depth: str, port: int, rounds: int) -> list[dict[str, Any]]:
    """One server over the double `depth`, streamed completions of SPLIT_LENS tokens in
    alternating runs of SPLIT_TOKENS tokens in all: each round's pair of CPU figures
    fitted to `per_request + per_token * tokens`."""
    proc = _child(["--serve", depth, str(port)], ROOT)
    try:
        _wait_listening(port, proc)
        assert proc.stdin is not None
        proc.stdin.write(f"period {PERIOD_MS[SPLIT_C]}\n")
        proc.stdin.flush()
        short, long = SPLIT_LENS

        def request_cpu(n: int) -> float:
            spec = _spec("completions", port, SPLIT_C, SPLIT_TOKENS // n, n)
            return float(sse_load.measure(spec, proc.pid)[sse_load.CPU]) * n

        request_cpu(long)  # warm-up
        fits = []
        for r in range(rounds):
            lens = SPLIT_LENS if r % 2 == 0 else SPLIT_LENS[::-1]
            cpu = {n: request_cpu(n) for n in lens}
            per_token = (cpu[long] - cpu[short]) / (long - short)
            fits.append(
                {
                    "per_token_us": per_token,
                    "per_request_us": cpu[short] - short * per_token,
                    "request_cpu_us": cpu,
                }
            )
            print(
                f"  {depth}: {fits[-1]['per_token_us']:.1f} us/token, "
                f"{fits[-1]['per_request_us']:.0f} us/request",
                flush=True,
            )
        return fits
    finally:
        stop_server(proc)


def split_table(fits: dict[str, list[dict[str, Any]]]) -> str:
    head = (
        f"Per request and per token: streamed completions ({PROMPT_LEN}-token prompts) of "
        f"{SPLIT_LENS[0]} and {SPLIT_LENS[1]} tokens in alternating runs ({SPLIT_TOKENS:,} "
        f"tokens each) at c={SPLIT_C}, one server over vLLM's output path on the double "
        f"(period {PERIOD_MS[SPLIT_C]:g} ms); each round's two CPU-per-request figures "
        "fitted to `per request + per token x tokens`; medians (min-max) over the rounds."
    )
    rows = []
    for name, runs in fits.items():
        per_token = [f["per_token_us"] for f in runs]
        per_request = [f["per_request_us"] for f in runs]
        share = [
            f["per_request_us"] / (f["per_request_us"] + OUTPUT_LEN * f["per_token_us"])
            for f in runs
        ]
        rows.append(
            [name, spread(per_token), spread(per_request, 0), spread([100 * x for x in share], 0)]
        )
    header = (
        "target",
        "us per token",
        "us per request",
        f"per request's share at {OUTPUT_LEN} tokens (%)",
    )
    return "\n".join([head, "", *markdown_table(header, rows)])


def _in_process_result(target: str, counts: dict[int, int], tree: Path) -> Any:
    proc = _child(["--in-process", target, json.dumps(counts)], tree)
    stdout, _ = proc.communicate(timeout=1800)
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{target} failed ({proc.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def measure_in_process(target: str, counts: dict[int, int], tree: Path) -> dict[int, Figures]:
    return {int(c): m for c, m in _in_process_result(target, counts, tree).items()}


def spread(values: list[float], digits: int = 1) -> str:
    med = statistics.median(values)
    if len(values) < 2:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _cpu(runs: list[Figures]) -> list[float]:
    return [m["cpu_us_per_token"] for m in runs]


def table(raw: dict[str, Any], apis: list[str], rounds: int) -> str:
    rows = []
    for c in CONCURRENCY:
        for name in IN_PROCESS:
            if name in raw:
                rows.append([c, name, "-", spread(_cpu([r[c] for r in raw[name]])), "-"])
        for name, bare in ((STUB, BARE_STUB), (VLLM_PATH, BARE_VLLM)):
            for api in apis:
                runs = [r[api][c] for r in raw[name]]
                own = [
                    s[api][c]["cpu_us_per_token"] - b[c]["cpu_us_per_token"]
                    for s, b in zip(raw[name], raw[bare], strict=True)
                ]
                rows.append([c, name, api, spread(_cpu(runs)), spread(own)])
    head = (
        f"No engine: the real app over an engine double stepping every request once per "
        f"step ({', '.join(f'{PERIOD_MS[c]:g} ms at c={c}' for c in CONCURRENCY)}), "
        f"{PROMPT_LEN}-token prompts, {OUTPUT_LEN} tokens per stream, "
        f"{', '.join(f'{n} streams at c={c}' for c, n in REQUESTS.items())}; server "
        f"pinned to core {SERVER_CORE}, load bench/sse_load.py on core {CLIENT_CORE}. CPU: "
        f"the process's user+sys per output token, median of {rounds} round(s) (min-max); "
        "own: above its bare twin (`bare stub` under `switchboard`, `bare AsyncLLM` under "
        "the vLLM output path), round by round."
    )
    header = ("c", "target", "API", "CPU us/token", "own us/token (above bare)")
    loads = ", ".join(f"{x[0]:.1f}" for x in raw["loads"])
    lean = []
    for c in CONCURRENCY:
        pairs = list(zip(raw[LEAN], raw[BARE_VLLM], strict=True))
        saved = [b[c]["cpu_us_per_token"] - x[c]["cpu_us_per_token"] for x, b in pairs]
        ratio = [x[c]["cpu_us_per_token"] / b[c]["cpu_us_per_token"] for x, b in pairs]
        lean.append(
            f"- c={c}: the lean consumer spends {spread(ratio, 2)}x the bare AsyncLLM's CPU "
            f"per token, {spread(saved)} us less."
        )
    foot = f"Load average (1 min) at each round's start: {loads}."
    return "\n".join([head, "", *markdown_table(header, rows), "", *lean, "", foot])


def _keyed(raw: dict[str, Any]) -> dict[str, Any]:
    """Raw figures read back from JSON: concurrencies as ints again."""

    def ints(by_c: dict[str, Figures]) -> dict[int, Figures]:
        return {int(c): m for c, m in by_c.items()}

    out: dict[str, Any] = {"loads": raw["loads"]}
    for name, runs in raw.items():
        if name in SERVERS:
            out[name] = [{api: ints(by_c) for api, by_c in run.items()} for run in runs]
        elif name in IN_PROCESS:
            out[name] = [ints(run) for run in runs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=8151)
    parser.add_argument("--apis", nargs="+", default=list(APIS), choices=APIS)
    parser.add_argument("--targets", nargs="+", default=[*SERVERS, *IN_PROCESS])  # SEAM: A/B
    parser.add_argument("--trees", nargs="+", metavar="NAME=PATH", help="A/B the server")
    parser.add_argument("--scale", type=float, default=1.0, help="requests per run x")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--out", type=Path, help="raw figures to this file (A/B)")
    parser.add_argument("--serve", nargs=2, metavar=("DEPTH", "PORT"))
    parser.add_argument("--in-process", nargs=2, metavar=("TARGET", "COUNTS"))
    parser.add_argument("--retable", action="store_true", help="the table from the results")
    parser.add_argument("--deltas-ab", type=int, metavar="TURNS", help="the deltas, A/B")
    parser.add_argument("--split", action="store_true", help="per request vs per token")
    args = parser.parse_args()
    if args.retable:
        record = json.loads((ROOT / "bench" / "results" / "per_token.json").read_text())
        write_table("per_token", table(_keyed(record["raw"]), args.apis, record["rounds"]))
        return
    if args.serve:
        import uvloop

        uvloop.run(_serve(args.serve[0], int(args.serve[1])))
        return
    if args.in_process:
        import uvloop

        counts = {int(c): n for c, n in json.loads(args.in_process[1]).items()}
        print("RESULT " + json.dumps(uvloop.run(_in_process(args.in_process[0], counts))))
        return
    os.sched_setaffinity(0, {CLIENT_CORE})
    if args.deltas_ab:
        os.environ["DELTAS_AB_TURNS"] = str(args.deltas_ab)
        turns = _in_process_result(DELTAS_AB, {16: REQUESTS[16], 64: REQUESTS[64]}, ROOT)
        figures = {"turns": turns, "output_len": OUTPUT_LEN, "period_ms": PERIOD_MS}
        publish("deltas", "per_token_deltas.json", figures, deltas_table(turns))
        return
    if args.split:
        # The vLLM output path only: the stub depth takes the RequestOutput path (deltas
        # need a real AsyncLLM), so its work is no longer a part of production's.
        fits = {VLLM_PATH: measure_split(SERVERS[VLLM_PATH], args.port, args.rounds)}
        figures = {
            "rounds": args.rounds,
            "concurrency": SPLIT_C,
            "output_lens": SPLIT_LENS,
            "tokens_per_run": SPLIT_TOKENS,
            "prompt_len": PROMPT_LEN,
            "period_ms": PERIOD_MS[SPLIT_C],
            "fits": fits,
        }
        publish("split", "per_token_split.json", figures, split_table(fits))
        return
    counts = {
        c: max(c, round(n * args.scale)) for c, n in REQUESTS.items() if c in args.concurrency
    }
    trees = dict(t.split("=", 1) for t in args.trees) if args.trees else {"": str(ROOT)}
    raw: dict[str, Any] = {"loads": []}
    for r in range(args.rounds):
        order = [
            (target, name, Path(tree))
            for target in args.targets
            for name, tree in (trees.items() if target in PER_TREE else [("", str(ROOT))])
        ]
        if r % 2:
            order.reverse()
        raw["loads"].append(os.getloadavg())
        print(f"round {r}: load average {raw['loads'][-1]}", flush=True)
        for target, name, tree in order:
            key = f"{target} [{name}]" if name else target
            if target in SERVERS:
                got: Any = measure_server(SERVERS[target], tree, args.port, args.apis, counts)
                for api, by_c in got.items():
                    cells = ", ".join(f"c={c} {m['cpu_us_per_token']:.1f}" for c, m in by_c.items())
                    print(f"  {key} {api}: {cells} us/token", flush=True)
            else:
                got = measure_in_process(target, counts, tree)
                cells = ", ".join(f"c={c} {m['cpu_us_per_token']:.1f}" for c, m in got.items())
                print(f"  {key}: {cells} us/token", flush=True)
            raw.setdefault(key, []).append(got)
            if args.out:
                args.out.write_text(json.dumps(raw, indent=1))
    partial = args.scale != 1.0 or set(args.concurrency) != set(CONCURRENCY)
    if args.trees or set(args.targets) != {*SERVERS, *IN_PROCESS} or partial:
        return
    figures = {
        "rounds": args.rounds,
        "prompt_len": PROMPT_LEN,
        "output_len": OUTPUT_LEN,
        "requests": REQUESTS,
        "period_ms": PERIOD_MS,
        "load_average_at_end": os.getloadavg(),
        "raw": raw,
    }
    publish("per_token", "per_token.json", figures, table(raw, args.apis, args.rounds))


if __name__ == "__main__":
    main()
