"""What every benchmark shares: the machine it ran on, starting and stopping a server
under test, and writing its table into a document between `<!-- bench:NAME -->`
markers."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


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


# A fixed piece of pure Python (an event built as the seam builds one per token), timed
# best of 7 in a fresh process: the host's speed at the moment, whatever it serves.
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


def host_reference(core: int) -> float:
    """`_HOST_REFERENCE`'s us per event on `core`, now. These VMs have run every target
    1.5-2x slower for hours with nothing else on them; a reference taken at each round's
    start tells a slow host from a slow change."""
    command = ["taskset", "-c", str(core), sys.executable, "-c", _HOST_REFERENCE]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` itself, every thread, no children (so a
    server's engine-core child is excluded): /proc/PID/stat fields 14 and 15."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def write_table(name: str, table: str, document: Path | None = None) -> None:
    """Replace what stands between the `bench:NAME` markers with `table`, in `document` or
    else in the one document that holds them (`marked_document`)."""
    if document is None:
        document = marked_document(name)
    pattern = _markers(name)
    text = document.read_text()
    if not pattern.search(text):
        raise ValueError(f"{document} has no bench:{name} markers")
    document.write_text(pattern.sub(lambda m: m.group(1) + table + m.group(2), text))


def publish(name: str, results: str, figures: dict[str, Any], table: str) -> None:
    """A run's end: its figures, with the date and the machine, to bench/results/RESULTS
    (JSON), its table between its `bench:NAME` markers (docs/benchmarks.md for most) and
    to stdout."""
    path = ROOT / "bench" / "results" / results
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), **figures}
    path.write_text(json.dumps(record, indent=1))
    write_table(name, table)
    print(table)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def start_server(
    command: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a server process (in its own process group) and wait until /health answers;
    `env` is added to this process's environment.
    One CPU engine at a time: the caller stops it with `stop_server` before the next.
    A port that already answers is refused: an orphan server left by a killed run would
    otherwise answer /health, and be measured, in place of the one started here."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is already served (an orphan server?)")
    kv = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **kv, **(env or {})},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600  # a CPU engine recompiling on a busy machine: 5+ min
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[2]} exited at start; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(proc)
    raise TimeoutError(f"{command[2]} did not start; see {log}")


def stop_server(proc: subprocess.Popen[Any]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def serve_tiny_8k(port: int, log: Path) -> subprocess.Popen[bytes]:
    """Switchboard on the tiny model with 8,192 positions (built on first use), room for
    long conversations."""
    model = ROOT / ".cache" / "tiny-model-8k"
    if not (model / "config.json").is_file():
        build = [sys.executable, "-m", "app.cli", "make-tiny-model", str(model)]
        build += ["--max-position-embeddings", "8192"]
        subprocess.run(build, check=True, cwd=ROOT)
    command = [sys.executable, "-m", "app.cli", "serve", "--model", str(model)]
    command += ["--served-model-name", "tiny", "--port", str(port), "--log-level", "warning"]
    command += ["--dtype", "float32", "--max-model-len", "8192"]
    return start_server(command, port, log)
