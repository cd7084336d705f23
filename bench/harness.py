"""The one harness every benchmark runs on: targets and the servers they start, load
clients, rounds and starts, CPU accounting, and results.

How to add a benchmark (one script per claim, its claim on docs/benchmarks.md in the shape
that page gives; an experiment is kept as its results in bench/results/ and its reading in
bench/results/README.md, not as code to maintain):

1. Targets: `switchboard(name, *flags)`, `vllm_serve(name, *flags, rust=...)`, or any
   `Target(name, argv, env)` whose command line serves HTTP on `{port}` (and gRPC on
   `{grpc_port}`). A target that is no server (vLLM's `AsyncLLM` in process, a bare
   transport) is a `Target(name, child=fn)`: `fn(round, log)` runs in its place and
   returns its figures.
2. What one start of a target measures: `measure(server, round) -> Figures`, a dict of
   numbers nested as the benchmark likes (by concurrency, by API). Load it with
   `rust_load` (vLLM's Rust client: completions and chat), `sse_load` (any SSE API,
   raw bytes) or the protocol clients of `clients`, and read the server inside
   `with server.meter() as m:` (the frontend's CPU: every process of the server but
   vLLM's engine; the wall time; vLLM's own count of generated tokens; its ITL); then
   `m.figures()`. A fresh server's first batch of each size is slow: warm it first.
3. `results = run_rounds(targets, measure, rounds=3, starts=1, name=...)`: one server
   alive at a time (two CPU engines slow each other), each start a fresh process, the
   order alternating from round to round; each round records the load average and
   `host_reference` (the host's Python speed then: a slow host is not a slow change).
4. Figures from `results`: `each` (every start), `per_round` (a round's starts, median),
   `within(a, b, ...)` (a over b, round by round: ratios hold where absolute figures
   drift); `spread` prints a median with its range.
5. `publish(NAME, figures, table)`: bench/results/NAME.json (with the date, the machine
   and every round) and the table between `<!-- bench:NAME -->` and
   `<!-- /bench:NAME -->` (in docs/benchmarks.md, or the page of what it measures: add
   the markers, and the claim on docs/benchmarks.md). Run it under the engine lock,
   with nothing else measuring: `flock /tmp/switchboard-engine.lock .venv/bin/python bench/NAME.py`.

The machine has two cores. vLLM's CPU build binds its OpenMP threads to core 0
(`CLIENT_CORE`: a load client placed there, at real-time priority, leaves the frontend
alone) and leaves core 1 (`FRONTEND_CORE`) to the frontend and the engine core's loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = ROOT / ".cache" / "tiny-model"
TINY_8K, _8K = ROOT / ".cache" / "tiny-model-8k", ("--max-position-embeddings", "8192")
PY = sys.executable
ENGINE_FLAGS = ("--dtype", "float32", "--max-model-len", "1024")
# Tool calls as the reference serves them (issue 31): the tiny model's hermes-style calls
# read back, and no whitespace inside constrained JSON (a random model pads it otherwise).
TOOL_FLAGS = (
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
)
CLIENT_CORE, FRONTEND_CORE = 0, 1
REALTIME = ("chrt", "--fifo", "10")
PORT, GRPC_PORT = 8141, 50141
ENGINE_TITLE = "VLLM::"  # vLLM titles its engine processes VLLM::EngineCore, VLLM::Worker

Figures = dict[Any, Any]


# -- the machine --------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


# A fixed piece of pure Python (an event built as the seam once built one per token),
# timed best of 7 in a fresh process: the host's speed at the moment, whatever it serves.
_HOST_REFERENCE = """\
import timeit
from dataclasses import dataclass

@dataclass(frozen=True)
class Event:
    token_ids: list
    text: str
    finish_reason: object = None

ids = [1]
print(min(timeit.repeat(lambda: Event(ids, "x"), number=100_000, repeat=7)) * 10)
"""


def host_reference(core: int = FRONTEND_CORE) -> float:
    """`_HOST_REFERENCE`'s us per event on `core`, now. These VMs have run every target
    1.5-2x slower for hours with nothing else on them; a reference taken at each round's
    start tells a slow host from a slow change."""
    command = ["taskset", "-c", str(core), PY, "-c", _HOST_REFERENCE]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def tiny_model(path: Path = MODEL, *flags: str) -> Path:
    """The tiny model at `path`, built on first use (`make-tiny-model PATH *flags`)."""
    if not (path / "config.json").is_file():
        command = [PY, "-m", "app.cli", "make-tiny-model", str(path), *flags]
        subprocess.run(command, check=True, cwd=ROOT)
    return path


# -- targets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A thing measured: a server's command line (`{port}` and `{grpc_port}` filled in at
    each start) and extra environment, or `child(round, log) -> Figures`, run in place of a
    server by a target that is none."""

    name: str
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    child: Callable[[Round, Path], Figures] | None = None

    def command(self, port: int, grpc_port: int) -> list[str]:
        # Not str.format: an argument may hold braces of its own (a JSON flag).
        fill = {"{port}": str(port), "{grpc_port}": str(grpc_port)}
        return [fill.get(part, part) for part in self.argv]


def switchboard(name: str = "switchboard", *flags: str, long: bool = False) -> Target:
    """`switchboard serve` on the tiny model (served as "tiny") as a user starts it, plus
    `flags`; gRPC on `{grpc_port}`. `long`: the tiny model with 8,192 positions (built on
    first use), room for long conversations."""
    model, length = (tiny_model(TINY_8K, *_8K), "8192") if long else (MODEL, "1024")
    argv = (PY, "-m", "app.cli", "serve", "--model", str(model), "--served-model-name", "tiny")
    argv += ("--port", "{port}", "--grpc-port", "{grpc_port}", "--log-level", "warning")
    return Target(name, (*argv, "--dtype", "float32", "--max-model-len", length, *flags))


def vllm_serve(name: str = "vllm serve", *flags: str, rust: bool = False) -> Target:
    """`vllm serve` on the tiny model with its Python frontend, or with its Rust one
    (`rust`, `VLLM_USE_RUST_FRONTEND=1`: vLLM starts the engine core and `vllm-rs
    frontend`); bench/vllm_serve.py runs vLLM's own command line on the CPU build."""
    argv = (PY, str(ROOT / "bench" / "vllm_serve.py"), "serve", str(MODEL))
    argv += ("--served-model-name", "tiny", "--port", "{port}", "--disable-uvicorn-access-log")
    argv += ENGINE_FLAGS
    if rust:  # it refuses uvicorn's log level (it runs no uvicorn)
        from vllm_rs import vllm_rs

        env = {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": str(vllm_rs())}
        return Target(name, (*argv, *flags), env)
    return Target(name, (*argv, "--uvicorn-log-level", "warning", *flags))


# -- servers ------------------------------------------------------------------------------


def _is_engine(process: psutil.Process) -> bool:
    try:
        return process.name().startswith(ENGINE_TITLE) or any(
            part.startswith(ENGINE_TITLE) for part in process.cmdline()[:1]
        )
    except psutil.Error:
        return False


def frontend_cpu(root: int) -> dict[int, float]:
    """User+sys CPU seconds of each process under `root` (itself included) that is not
    vLLM's engine (a `VLLM::` process, or below one): a server's frontend, whatever it is
    made of (Switchboard's one process; `vllm serve`'s API server; the Rust frontend and
    the Python supervisor above it)."""
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


def cpu_seconds(root: int) -> float:
    """`frontend_cpu(root)`, summed."""
    return sum(frontend_cpu(root).values())


def own_cpu() -> float:
    """This process's user+sys CPU seconds (a target measured in process)."""
    times = os.times()
    return times.user + times.system


GENERATED = ("vllm:generation_tokens_total", "vllm:generation_tokens")  # Rust: either
ITL = "vllm:inter_token_latency_seconds"


class Server:
    """A started target: where it answers, and what it has spent."""

    def __init__(
        self, target: Target, port: int, grpc_port: int, proc: subprocess.Popen[bytes]
    ) -> None:
        self.target, self.port, self.grpc_port, self.proc = target, port, grpc_port, proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    model = "tiny"  # every target serves the tiny model under this name

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    http = url

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def frontend_cpu(self) -> dict[int, float]:
        return frontend_cpu(self.pid)

    def metric(self, *names: str) -> float:
        """The sum of every sample of the named metrics on /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[-1])
            for line in text.splitlines()
            if line.split("{", 1)[0].split(" ", 1)[0] in names
        )

    def meter(self, tokens: bool = True) -> Meter:
        """A `Meter` around a block of load on this server (`tokens`: read vLLM's own
        count of generated tokens and its ITL around it, from /metrics)."""
        return Meter(self, tokens)

    def warm(self, path: str = "/v1/completions") -> None:
        """A fresh CPU engine's first request pays its warm-up: one short request."""
        body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4}
        if path.endswith("chat/completions"):
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            body["max_tokens"] = 4
        httpx.post(f"{self.url}{path}", json=body, timeout=300).raise_for_status()


class Meter:
    """What a server spent over a block of load: its frontend's CPU (`frontend_cpu`), the
    wall time, and (`tokens`) vLLM's own count of the tokens it generated
    (`vllm:generation_tokens_total`: a load client now and then counts chunks where a
    usage chunk went missing; the server's count is the truth) and the mean of vLLM's
    inter-token latency histogram, whose times are the engine core's own step
    timestamps (so the engine's pace, whatever the frontend's delivery added)."""

    def __init__(self, server: Server, tokens: bool) -> None:
        self.server, self.count = server, tokens
        self.cpu_s = self.wall_s = self.tokens = 0.0
        self.itl_mean_ms: float | None = None

    def _itl(self) -> tuple[float, float]:
        return self.server.metric(f"{ITL}_sum"), self.server.metric(f"{ITL}_count")

    def __enter__(self) -> Meter:
        if self.count:
            self._tokens, self._itl_before = self.server.metric(*GENERATED), self._itl()
        self._cpu = self.server.frontend_cpu()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._start
        after = self.server.frontend_cpu()
        self.cpu_s = sum(cpu - self._cpu.get(pid, 0.0) for pid, cpu in after.items())
        if self.count and exc[0] is None:
            self.tokens = self.server.metric(*GENERATED) - self._tokens
            itl = self._itl()
            count = itl[1] - self._itl_before[1]
            if count:  # a server that keeps no such histogram has no such figure
                self.itl_mean_ms = (itl[0] - self._itl_before[0]) / count * 1e3

    def figures(self, tokens: float | None = None) -> Figures:
        """Output tok/s and frontend CPU per output token over the block, of `tokens` (a
        count the caller checked) or of vLLM's own count."""
        tokens = self.tokens if tokens is None else tokens
        if not tokens:
            raise RuntimeError("no output tokens were counted")
        out = {
            "output_tok_s": tokens / self.wall_s,
            "frontend_cpu_us_per_tok": self.cpu_s / tokens * 1e6,
            "frontend_cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "tokens": tokens,
        }
        if self.itl_mean_ms is not None:
            out["engine_itl_mean_ms"] = self.itl_mean_ms
        return out


@contextmanager
def started(
    target: Target, log: Path | None = None, *, port: int = PORT, grpc_port: int = GRPC_PORT
) -> Iterator[Server]:
    """`target` started (in its own process group) and answering /health, stopped (the
    whole group) when the block ends; its output goes to `log` (else a temporary file,
    named on stdout). The engine's KV cache is 1 GiB unless the environment says
    otherwise. A port that already answers is refused: an orphan server left by a killed
    run would otherwise answer /health, and be measured, in its place."""
    if log is None:
        log = Path(tempfile.mkstemp(prefix=f"{target.name.replace(' ', '-')}-", suffix=".log")[1])
        print(f"{target.name}: log in {log}", flush=True)
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is already served (an orphan server?)")
    kv = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.Popen(
        target.command(port, grpc_port),
        cwd=ROOT,
        env={**os.environ, **kv, **target.env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600  # a CPU engine compiling on a busy machine: 5+ min
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{target.name} exited at start; see {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{target.name} did not start; see {log}")
            time.sleep(1)
        yield Server(target, port, grpc_port, proc)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- rounds and starts --------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One round: every target once (or `starts` times), in `order`."""

    index: int
    order: tuple[str, ...]
    load_average: tuple[float, float, float]
    host_reference_us: float

    def seed(self, salt: int = 0) -> int:
        """One seed per round and salt (a concurrency, say), the same for every target."""
        return 1000 * self.index + salt


def order_of(names: Sequence[str], index: int) -> list[str]:
    """Round `index`'s order: rotated every round and, with more than two targets,
    reversed every odd round (with two, the reversal would undo the rotation)."""
    n = len(names)
    order = [*names[index % n :], *names[: index % n]]
    if index % 2 and n > 2:
        order.reverse()
    return order


class Results:
    """Every start's figures: `raw[target][round][start]`, and each round's `Round`."""

    def __init__(self, targets: Iterable[str]) -> None:
        self.raw: dict[str, list[list[Figures]]] = {name: [] for name in targets}
        self.rounds: list[Round] = []

    def add(self, target: str, round_: Round, figures: Figures) -> None:
        runs = self.raw[target]
        while len(runs) <= round_.index:
            runs.append([])
        runs[round_.index].append(figures)

    def each(self, target: str, *path: Any) -> list[float]:
        """The figure at `path` of every start of `target`, in order."""
        return [_at(f, path) for starts in self.raw[target] for f in starts]

    def per_round(self, target: str, *path: Any) -> list[float]:
        """The figure at `path`, one per round (the median of the round's starts)."""
        return [statistics.median(_at(f, path) for f in starts) for starts in self.raw[target]]

    def within(self, a: str, b: str, *path: Any) -> list[float]:
        """`a`'s figure at `path` over `b`'s, round by round."""
        return ratios(self.per_round(a, *path), self.per_round(b, *path))

    def record(self) -> Figures:
        """What bench/results keeps: every round and every start."""
        return {"rounds": [asdict(r) for r in self.rounds], "raw": self.raw}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Results:
        """The results `record()` kept (to re-render a table, or to run more rounds)."""
        results = cls(record["raw"])
        results.raw = record["raw"]
        results.rounds = [
            Round(r["index"], tuple(r["order"]), tuple(r["load_average"]), r["host_reference_us"])
            for r in record["rounds"]
        ]
        return results


def _at(figures: Any, path: Sequence[Any]) -> float:
    for key in path:
        figures = figures[key] if key in figures else figures[str(key)]
    return float(figures)


def run_rounds(
    targets: Sequence[Target],
    measure: Callable[[Server, Round], Figures],
    *,
    rounds: int,
    name: str,
    starts: int = 1,
    port: int = PORT,
    grpc_port: int = GRPC_PORT,
    earlier: Results | None = None,
) -> Results:
    """Every target, `starts` fresh starts each, in each of `rounds` rounds: one server
    alive at a time, `measure(server, round)` per start (a `child` target runs its child
    instead). Logs, and the figures so far after each start (should a later one fail),
    go to a temporary directory named `name`, printed first. `earlier`: the rounds of an
    earlier run of the same targets, continued (round numbers, seeds and orders go on
    from them), so that a long run can be split into runs short enough to hold the
    engine lock for."""
    logs = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    print(f"logs in {logs}", flush=True)
    results = earlier or Results(t.name for t in targets)
    by_name = {t.name: t for t in targets}
    if set(results.raw) != set(by_name):
        raise ValueError(f"earlier rounds of {sorted(results.raw)}, not {sorted(by_name)}")
    first = len(results.rounds)
    for r in range(first, first + rounds):
        round_ = Round(r, tuple(order_of(list(by_name), r)), os.getloadavg(), host_reference())
        results.rounds.append(round_)
        print(
            f"round {r}: {', '.join(round_.order)}; load average {round_.load_average}; "
            f"host reference {round_.host_reference_us:.2f} us",
            flush=True,
        )
        for target in (by_name[n] for n in round_.order):
            for s in range(starts):
                log = logs / f"{target.name.replace(' ', '-')}-{r}-{s}.log"
                if target.child is not None:
                    figures = target.child(round_, log)
                else:
                    with started(target, log, port=port, grpc_port=grpc_port) as server:
                        figures = measure(server, round_)
                results.add(target.name, round_, figures)
                (logs / "results.json").write_text(json.dumps(results.record()))
    return results


# -- figures ------------------------------------------------------------------------------


def spread(values: Sequence[float], digits: int = 0) -> str:
    """The median, and the range when there are several values: `m (min-max)`."""
    med = statistics.median(values)
    if len(values) < 2:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def ratios(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """x / y, pair by pair (round by round, turn by turn)."""
    return [x / y for x, y in zip(xs, ys, strict=True)]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


# -- load clients -------------------------------------------------------------------------


def rust_load(
    port: int,
    concurrency: int,
    prompts: int,
    seed: int,
    *,
    input_len: int = 128,
    output_len: int = 64,
    pinned: bool = True,
) -> Figures:
    """One run of `vllm-rs bench serve`, vLLM's Rust load client (bench/vllm_rs.py fetches
    it; ~8 us of CPU a token): streamed completions of random `input_len`-token prompts
    (token ids: the tiny tokenizer's text round trip does not converge), `output_len`
    tokens each (`ignore_eos`). `pinned`: on `CLIENT_CORE` at real-time priority, where it
    never takes the frontend's core (at normal priority there it read each stream in
    bursts behind the OpenMP threads); else wherever the kernel puts it, as a client on
    the same host would run. Its result JSON (`completed` of the `prompts`); a run with a
    failure other than a lost keep-alive race, or more than 1% of them, is kept in /tmp
    and refused."""
    from vllm_rs import vllm_rs

    place = ["taskset", "-c", str(CLIENT_CORE), *REALTIME] if pinned else []
    with tempfile.TemporaryDirectory() as out:
        command = [*place, str(vllm_rs()), "bench", "serve", "--backend", "openai"]
        command += ["--port", str(port), "--model", "tiny", "--tokenizer", str(MODEL)]
        command += ["--dataset-name", "random", "--random-input-len", str(input_len)]
        command += ["--random-output-len", str(output_len), "--prompt-token-ids", "--ignore-eos"]
        command += ["--max-concurrency", str(concurrency), "--num-prompts", str(prompts)]
        command += ["--seed", str(seed), "--disable-tqdm"]
        command += ["--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"]
        command += ["--save-result", "--save-detailed", "--result-dir", out]
        command += ["--result-filename", "r.json"]
        subprocess.run(command, check=True, capture_output=True, timeout=600)
        text = (Path(out) / "r.json").read_text()
    result: Figures = json.loads(text)
    errors = [e for e in result.get("errors", []) if e]
    # The one failure tolerated: a pooled connection the server closed as idle just as the
    # client sent on it (hyper's "connection closed before message completed"), which an
    # unpinned client stalled for seconds meets now and then; the request never ran. Each
    # of the pool's `concurrency` connections can meet it once (17 at 64 streams, through
    # the Rust frontend, which closes idle connections sooner than uvicorn).
    bound = max(prompts // 100, concurrency)
    raced = all(_KEEP_ALIVE_RACE in e for e in errors) and len(errors) <= bound
    if result["completed"] + len(errors) != prompts or (errors and not raced):
        kept = Path(tempfile.mkstemp(prefix="rust-load-refused-", suffix=".json")[1])
        kept.write_text(text)
        raise RuntimeError(f"{result['completed']} of {prompts} requests completed; see {kept}")
    return result


_KEEP_ALIVE_RACE = "connection closed before message completed"


# -- results ------------------------------------------------------------------------------


def documents() -> list[Path]:
    """Where benchmark tables may live: the README and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _markers(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"^(<!-- bench:{re.escape(name)} -->\n).*?(\n<!-- /bench:{re.escape(name)} -->)$",
        re.S | re.M,
    )


def marked_document(name: str) -> Path:
    """The one document (README.md or docs/*.md) holding the `bench:NAME` markers: tables
    move between pages as the docs grow, and a script should not have to follow them."""
    holders = [path for path in documents() if _markers(name).search(path.read_text())]
    if len(holders) != 1:
        found = ", ".join(str(path.relative_to(ROOT)) for path in holders) or "none"
        raise ValueError(
            f"bench:{name} markers must be in exactly one of README.md and docs/*.md "
            f"(found in: {found})"
        )
    return holders[0]


def write_table(name: str, table: str) -> None:
    """Replace what stands between the `bench:NAME` markers with `table`."""
    document = marked_document(name)
    text = document.read_text()
    document.write_text(_markers(name).sub(lambda m: m.group(1) + table + m.group(2), text))


def publish(name: str, figures: Mapping[str, Any], table: str, results: str | None = None) -> None:
    """A run's end: its figures, with the date and the machine, to
    bench/results/NAME.json (or `results`), its table between its `bench:NAME` markers and
    to stdout."""
    path = RESULTS / (results or f"{name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), **figures}
    path.write_text(json.dumps(record, indent=1))
    write_table(name, table)
    print(table)
