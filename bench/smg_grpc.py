"""SMG's modes in front of two replicas (issue 42): SMG 1.13 in gRPC mode in front of two
Switchboard replicas (`vllm.grpc.engine.VllmEngine` on their `--grpc-port`), against SMG
in gRPC mode in front of two `vllm serve --grpc` replicas (vLLM 0.32 with
smg-grpc-servicer), against SMG in HTTP mode in front of two Switchboard replicas.

One server set alive at a time (two engines and a router; a set is a harness child),
the order alternating round by round; streamed chat (`bench/sse_load.py`: a Python
client reading raw bytes on the engine's core 0 at real-time priority; 64 tokens each,
`ignore_eos`, every answer's usage checked) at 16 and 64 streams, each the median of
`RUNS` runs after an unmeasured warm run. Figures per set: output tok/s, TTFT p50 (the
client's), the workers' CPU per output token (every process of each replica but vLLM's
engine: what a worker costs beside its engine) and SMG's own.

    /work/bin/heavy .venv/bin/python bench/smg_grpc.py [--rounds N] [--no-publish]

Each replica's engine is bound to a core of its own (`VLLM_CPU_OMP_THREADS_BIND`), as
the fleet binds them; Switchboard's frontends are left unpinned, as the fleet leaves
them (docs/operations.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import sse_load
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import (
    ENGINE_FLAGS,
    MODEL,
    PY,
    ROOT,
    Figures,
    Results,
    Round,
    Target,
    _stop,
    frontend_cpu,
    markdown_table,
    publish,
    run_rounds,
    spread,
    switchboard,
)

SB_GRPC, VLLM_GRPC, SB_HTTP = (
    "SMG gRPC -> Switchboard",
    "SMG gRPC -> vllm serve --grpc",
    "SMG HTTP -> Switchboard",
)
STREAMS = {16: 4, 64: 2}  # concurrency -> requests per client a run
RUNS = 3
OUTPUT = 64
PROMPT = "Tell me a long story about a lighthouse keeper and the sea."
SMG_BIN = str(Path(PY).parent / "smg")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(
    ready: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], timeout_s: float = 900
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start")
        with contextlib.suppress(Exception):
            if ready():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not start")
        time.sleep(1)


def _grpc_serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=2
        )
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class Replica:
    def __init__(self, kind: str, core: int, log: Path) -> None:
        self.kind, self.port, self.grpc_port = kind, _free_port(), _free_port()
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(core)}
        if kind == "vllm":
            argv = [PY, str(ROOT / "bench" / "vllm_serve.py"), "serve", str(MODEL), "--grpc"]
            argv += ["--port", str(self.grpc_port), "--served-model-name", "tiny", *ENGINE_FLAGS]
        else:
            target = switchboard("switchboard", "--pin-frontend", "false")
            argv = target.command(self.port, self.grpc_port)
        self.proc = _spawn(argv, env, log)

    def wait(self) -> None:
        if self.kind == "vllm":
            _wait(lambda: _grpc_serving(f"127.0.0.1:{self.grpc_port}"), "vllm serve", self.proc)
        else:
            url = f"http://127.0.0.1:{self.port}/ready"
            _wait(lambda: httpx.get(url, timeout=2).status_code == 200, "switchboard", self.proc)

    def worker_url(self, grpc_mode: bool) -> str:
        if grpc_mode:
            return f"grpc://127.0.0.1:{self.grpc_port}"
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def server_set(kind: str, grpc_mode: bool, log: Path) -> Iterator[tuple[list[Replica], int, int]]:
    """Two replicas of `kind` and SMG in front (`grpc_mode`: its gRPC mode); the replicas,
    SMG's port and pid."""
    replicas: list[Replica] = []
    smg = None
    try:
        replicas = [Replica(kind, core, log) for core in (0, 1)]
        for replica in replicas:
            replica.wait()
        port = _free_port()
        argv = [SMG_BIN, "launch", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--worker-urls", *(r.worker_url(grpc_mode) for r in replicas)]
        argv += ["--policy", "round_robin", "--log-level", "warn"]
        argv += ["--prometheus-port", str(_free_port())]
        if grpc_mode:
            argv += ["--model-path", str(MODEL)]
        smg = _spawn(argv, {}, log)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"

        def answers() -> bool:
            return httpx.post(url, json=body, timeout=30).status_code == 200

        _wait(answers, "smg", smg, timeout_s=300)
        yield replicas, port, smg.pid
    finally:
        for proc in [smg, *(r.proc for r in replicas)]:
            if proc is not None:
                _stop(proc)


def _cpu(pids: list[int]) -> float:
    return sum(sum(frontend_cpu(pid).values()) for pid in pids)


def one_set(kind: str, grpc_mode: bool) -> Callable[[Round, Path], Figures]:
    def child(round_: Round, log: Path) -> Figures:
        out: Figures = {}
        with server_set(kind, grpc_mode, log) as (replicas, port, smg_pid):
            workers = [r.proc.pid for r in replicas]
            warm = sse_load.chat(port, "tiny", PROMPT, OUTPUT, max(STREAMS), 1)
            sse_load.run(warm)
            for c, requests in STREAMS.items():
                runs = []
                for _ in range(RUNS):
                    spec = sse_load.chat(port, "tiny", PROMPT, OUTPUT, c, requests)
                    before_w, before_r = _cpu(workers), _cpu([smg_pid])
                    result = sse_load.run(spec)
                    worker_s, router_s = _cpu(workers) - before_w, _cpu([smg_pid]) - before_r
                    wrong = [n for n in result["tokens"] if n != OUTPUT]
                    if len(result["tokens"]) != c * requests or wrong:
                        raise AssertionError(f"token counts {wrong[:5]} (wanted {OUTPUT})")
                    tokens = c * requests * OUTPUT
                    runs.append(
                        {
                            "output_tok_s": tokens / result["wall_s"],
                            "ttft_p50_ms": result["ttft_p50_ms"],
                            "worker_cpu_us_per_tok": worker_s / tokens * 1e6,
                            "smg_cpu_us_per_tok": router_s / tokens * 1e6,
                        }
                    )
                    print(f"  c={c}: {runs[-1]}", flush=True)
                out[c] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                out[c]["runs"] = runs
        return out

    return child


def targets() -> list[Target]:
    return [
        Target(SB_GRPC, child=one_set("switchboard", True)),
        Target(VLLM_GRPC, child=one_set("vllm", True)),
        Target(SB_HTTP, child=one_set("switchboard", False)),
    ]


def table(results: Results) -> str:
    rows = []
    for c in STREAMS:
        for name in (SB_GRPC, VLLM_GRPC, SB_HTTP):
            rows.append(
                [
                    name,
                    c,
                    spread(results.per_round(name, c, "output_tok_s")),
                    spread(results.per_round(name, c, "ttft_p50_ms")),
                    spread(results.per_round(name, c, "worker_cpu_us_per_tok"), 1),
                    spread(results.per_round(name, c, "smg_cpu_us_per_tok"), 1),
                ]
            )
    header = ["server set", "streams", "tok/s", "TTFT p50 ms", "workers' CPU us/tok",
              "SMG's CPU us/tok"]  # fmt: skip
    return "\n".join(markdown_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-publish", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory():
        results = run_rounds(targets(), lambda s, r: {}, rounds=args.rounds, name="smg_grpc")
    text = table(results)
    print(text)
    if not args.no_publish:
        publish("smg_grpc", results.record(), text)


if __name__ == "__main__":
    main()
