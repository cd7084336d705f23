"""Switchboard's own CPU per output token at 64 streams, without vLLM: the server before
issue 41, this tree untraced and this tree traced, each serving an engine that costs
(nearly) nothing and steps at a fixed pace, so that a difference of 5% between them can
be resolved (issue 38: the frontend's CPU per token within 5% of before; issue 41:
tracing on at most 1.05x off).

Why not bench/traces.py alone: there a token's CPU is the frontend's share of a core over
the engine's pace, and on two cores vLLM's pace moves 5-20% from start to start, with
vLLM's own frontend work (its output processor, detokenizer, stats) in the same process:
runs of one build read 103-160 us a token (bench/results/README.md, "Traces"). Here the
engine is a fake (`tests/fake_engine.py`'s `FakeEngine`, each tree's own, for its info,
tokenizer and abort; `run` replaced by one stepping loop that hands every running request
a token each `STEP_S`, as vLLM's output loop hands on one step's outputs), so what is
measured is the code that changed between the trees: routes, admission, telemetry, the
access log, SSE writing, tracing (our span only: vLLM's `llm_request` is not made, as no
vLLM engine runs). Each target is its tree's own `switchboard serve` (`app.cli`'s `_run`:
settings, logging, `settle_heap`, uvicorn as configured) with `start_engine` replaced by
the fake, pinned to `FRONTEND_CORE`, the load client on `CLIENT_CORE` at real-time
priority, so nothing shares the server's core but the host. The three servers are
started once and stay alive together (an idle fake engine costs nothing): the runs of a
round follow each other within seconds, so the host's drift, which moves every figure here
10-30% over minutes, falls on both sides of each ratio.

- before: a checkout of bench/traces.py's `BEFORE`, run as bench/traces.py runs it
  (`python -P`, the checkout first on the path);
- tracing off: this tree as it starts by default (the access log on, in text);
- tracing on: with `--otlp-traces-endpoint` to an OTLP receiver in this process;
- (`--targets` only) tracing off, no access log: `--access-log off`, the line's cost.

Load: bench/traces.py's (`vllm-rs bench serve`, 64 streams, random prompts of 128 token
ids, 64 output tokens, `ignore_eos`), `--prompts` a run, one run a target a round after
a warm-up run at the start; medians of the rounds, and ratios round by round. CPU is the
server process's user+sys over the run (`harness.Meter`, from /proc), per output token
(the client's completed requests x 64). `perf stat -e instructions` would be steadier
than CPU time, but this VM exposes no hardware counters.

    /work/bin/heavy .venv/bin/python bench/frontend_own_cpu.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness import (
    FRONTEND_CORE,
    GRPC_PORT,
    MODEL,
    PORT,
    PY,
    ROOT,
    Figures,
    Results,
    Round,
    Server,
    Target,
    host_reference,
    markdown_table,
    order_of,
    publish,
    rust_load,
    spread,
    started,
    switchboard,
)

CONCURRENCY, OUTPUT_LEN = 64, 64
PROMPTS = 512
STEP_S = 0.015  # vLLM's ITL at this load on this machine: 14.5-15.1 ms (traces.json)
BEFORE_NAME, OFF, ON = "before", "tracing off", "tracing on"
QUIET = "tracing off, no access log"  # not run by default: what the access log costs
BENCH = Path(__file__).resolve().parent

# The server's process: the tree under test first on the path (-P: not the working
# directory), this directory after it for `serve` alone.
_BOOT = f"import sys; sys.path.append({str(BENCH)!r}); import frontend_own_cpu as f; f.serve()"


def serve() -> None:
    """`switchboard serve` of the tree first on the path, its engine a paced fake: run in
    the server's process (`_BOOT`), with `serve`'s flags as arguments. Imports only that
    tree's `app` and `tests`, so one function serves every tree whose `FakeEngine`,
    `TokenEvent` and `start_engine` have today's shape."""
    import asyncio
    import dataclasses
    import time

    from app import cli
    from app.engine import base
    from app.engine.vllm import startup
    from tests.fake_engine import FakeEngine

    Entry = list[Any]  # [request, receive, tokens left, last token, first, done]

    class PacedEngine(FakeEngine):  # type: ignore[misc]
        """Every running request one token a step, each `STEP_S` from the first step's
        start whatever the step took; a request joins at the next step."""

        def __init__(self, info: Any) -> None:
            super().__init__()
            self._info = info
            self._entries: list[Entry] = []
            self._stepping: asyncio.Task[None] | None = None

        def shutdown(self) -> None:
            pass

        async def run(self, request: Any, receive: Any) -> None:
            prompt = request.prompt_token_ids or self.tokenizer.encode(request.prompt_text)
            done = asyncio.get_running_loop().create_future()
            entry = [request, receive, request.sampling.max_tokens, prompt[-1], True, done]
            self._entries.append(entry)
            self.running.add(request.request_id)
            trace = getattr(request, "trace", None)
            if trace is not None:  # as vLLM's engine tells a traced request's stages
                trace.queued = trace.scheduled = time.monotonic()
            if self._stepping is None or self._stepping.done():
                self._stepping = asyncio.ensure_future(self._step())
            try:
                await done
            finally:
                if entry in self._entries:
                    self._entries.remove(entry)
                self.running.discard(request.request_id)
                if trace is not None:
                    trace.first_token = trace.scheduled
                    trace.last_token = time.monotonic()

        async def generate(self, request: Any) -> Any:
            queue: asyncio.Queue[Any] = asyncio.Queue()
            task = asyncio.ensure_future(self.run(request, queue.put_nowait))
            task.add_done_callback(lambda _: queue.put_nowait(None))
            try:
                while (event := await queue.get()) is not None:
                    yield event
                await task
            finally:
                task.cancel()

        async def _step(self) -> None:
            loop = asyncio.get_running_loop()
            start, step = loop.time(), 0
            while self._entries:
                step += 1
                await asyncio.sleep(max(0.0, start + step * STEP_S - loop.time()))
                for entry in list(self._entries):
                    self._hand_on(entry)

        def _hand_on(self, entry: Entry) -> None:
            request, receive, left, last, first, done = entry
            if request.request_id not in self.running:  # aborted
                event = base.TokenEvent(token_ids=[], text="", finish_reason="abort")
                left = 0
            else:
                token = last % 255 + 1  # never 0, the fake's EOS
                left -= 1
                event = base.TokenEvent(
                    token_ids=[token],
                    text=chr(token),
                    finish_reason=None if left else "length",
                    prompt_token_ids=request.prompt_token_ids if first else None,
                )
                entry[2:5] = left, token, False
            try:
                receive(event)
            except BaseException as exc:  # as vLLM: the error raised, the request gone
                self._entries.remove(entry)
                done.set_exception(exc)
                return
            if not left:
                self._entries.remove(entry)
                done.set_result(None)

    async def start_engine(settings: Any, *_: Any) -> PacedEngine:
        info = FakeEngine().info
        changes = {"model_name": settings.model_name, "max_model_len": 1024}
        return PacedEngine(dataclasses.replace(info, vocab_size=2048, **changes))

    startup.start_engine = start_engine
    cli.main(["serve", *sys.argv[1:]])


def targets(names: list[str], before: Path, endpoint: str) -> list[Target]:
    def paced(name: str, tree: Path, *flags: str) -> Target:
        serve_flags = switchboard(name, *flags).argv[4:]  # what follows `-m app.cli serve`
        place = ("taskset", "-c", str(FRONTEND_CORE))
        return Target(
            name, (*place, PY, "-P", "-c", _BOOT, *serve_flags), {"PYTHONPATH": str(tree)}
        )

    every = {
        BEFORE_NAME: paced(BEFORE_NAME, before),
        OFF: paced(OFF, ROOT),
        ON: paced(ON, ROOT, "--otlp-traces-endpoint", endpoint),
        QUIET: paced(QUIET, ROOT, "--access-log", "off"),
    }
    return [every[name] for name in names]


def _by_thread(pid: int) -> tuple[float, float]:
    """CPU seconds of `pid`'s main thread (the event loop) and of its other threads
    (prompt threads, the span exporter, gRPC's), from /proc."""
    main = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # a thread that ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICK
        if int(tid) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


_TICK = os.sysconf("SC_CLK_TCK")


def one_run(server: Server, prompts: int, seed: int) -> Figures:
    """One run of the load on `server`, metered: its CPU a token (all, and its event loop's
    thread's), its pace."""
    threads = _by_thread(server.pid)
    with server.meter(tokens=False) as m:
        result = rust_load(server.port, CONCURRENCY, prompts, seed)
    (main, other), (main_0, other_0) = _by_thread(server.pid), threads
    main, other = main - main_0, other - other_0
    tokens = result["completed"] * OUTPUT_LEN
    figures = m.figures(tokens)
    figures["core_share"] = m.cpu_s / m.wall_s
    figures["loop_cpu_us_per_tok"] = main / tokens * 1e6
    figures["threads_cpu_us_per_tok"] = other / tokens * 1e6
    print(
        f"  {server.target.name}: {figures['output_tok_s']:.0f} tok/s, "
        f"{figures['frontend_cpu_us_per_tok']:.2f} us/tok "
        f"({figures['loop_cpu_us_per_tok']:.2f} the loop's), "
        f"{figures['core_share']:.3f} of a core",
        flush=True,
    )
    return figures


def run_turns(
    targets: list[Target], receiver: Any, *, rounds: int, prompts: int
) -> tuple[Results, Figures]:
    """Every target started once, all alive together (a fake engine idles at no cost), then
    `rounds` rounds of one run each, in `order_of`'s order: pairs of runs seconds apart, so
    that the host's drift (hours long here) falls on both sides of a ratio. Also the spans
    the receiver got against the requests the traced server served (once its exporter's
    last batch is out: it exports every 5 s)."""
    logs = Path(tempfile.mkdtemp(prefix="frontend_own_cpu-"))
    print(f"logs in {logs}", flush=True)
    results = Results(t.name for t in targets)
    with ExitStack() as stack:
        servers = {}
        for i, target in enumerate(targets):
            log = logs / f"{target.name.replace(' ', '-')}.log"
            server = stack.enter_context(
                started(target, log, port=PORT + i, grpc_port=GRPC_PORT + i)
            )
            server.warm()
            rust_load(server.port, CONCURRENCY, CONCURRENCY * 4, 10**6)
            servers[target.name] = server
        for r in range(rounds):
            names = order_of(list(servers), r)
            round_ = Round(r, tuple(names), os.getloadavg(), host_reference())
            results.rounds.append(round_)
            print(f"round {r}: host reference {round_.host_reference_us:.2f} us", flush=True)
            for name in names:
                figures = one_run(servers[name], prompts, round_.seed())
                results.add(name, round_, figures)
            (logs / "results.json").write_text(json.dumps(results.record()))
        time.sleep(6)
    traced = (1 + 4 * CONCURRENCY + rounds * prompts) if ON in servers else 0
    return results, {"spans_received": len(receiver.spans()), "traced_requests": traced}


def table(results: Results, names: list[str], spans: Figures) -> str:
    cpu = "frontend_cpu_us_per_tok"
    rows = [
        [
            name,
            spread(results.each(name, cpu), 2),
            spread(results.each(name, "loop_cpu_us_per_tok"), 2),
            spread(results.each(name, "threads_cpu_us_per_tok"), 2),
            spread(results.each(name, "output_tok_s")),
        ]
        for name in names
    ]
    header = ["target", "own CPU us/token", "its loop's thread", "its other threads"]
    header.append("output tok/s")
    ratios = [
        f"- {a} / {b}, round by round: {spread(results.within(a, b, cpu), 3)}"
        for a, b in ((ON, OFF), (OFF, BEFORE_NAME), (ON, BEFORE_NAME), (OFF, QUIET))
        if a in names and b in names
    ]
    if spans["traced_requests"]:
        ratios.append(
            f"- spans received: {spans['spans_received']} for "
            f"{spans['traced_requests']} traced requests"
        )
    return "\n".join([*markdown_table(header, rows), "", *ratios])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="requests a run")
    parser.add_argument("--targets", nargs="+", default=[BEFORE_NAME, OFF, ON])
    parser.add_argument("--no-publish", action="store_true")
    args = parser.parse_args()
    assert MODEL.is_dir(), "the tiny model: switchboard make-tiny-model .cache/tiny-model"
    sys.path.insert(0, str(ROOT))
    from traces import BEFORE, checkout

    from tests.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver()
    try:
        with checkout(BEFORE) as before:
            every = targets(args.targets, before, receiver.endpoint)
            results, spans = run_turns(every, receiver, rounds=args.rounds, prompts=args.prompts)
    finally:
        receiver.stop()
    text = table(results, args.targets, spans)
    if args.no_publish:
        print(text)
        return
    record = {"step_s": STEP_S, "prompts": args.prompts, **spans, "results": results.record()}
    publish("frontend_own_cpu", record, text)


if __name__ == "__main__":
    main()
