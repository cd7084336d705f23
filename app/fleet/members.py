"""The processes of a fleet: each a child with a log file, started, probed, stopped.

A member runs in a process group of its own, so that a signal to the fleet's process
group (Ctrl-C on `switchboard fleet`) reaches only the fleet, which stops its members in
order (routers first, then each replica's drain, then Redis). It stays in the fleet's
session: Linux schedules each session as one group (autogroup), where a process's
niceness weighs only against its own session's, so replicas in sessions of their own
made the engines' spinning at niceness 10 (app/engine/cpu_host.py) as heavy as a
restarting replica's start (seen: its engine core importing vLLM at 7% of a CPU for
two and a half minutes, under the suite's load). Each engine has since moved into a
session of its own whose group runs at that niceness, which keeps its spinning behind
every other session's work whatever session its server is in. `stop` is SIGTERM to the member
(a replica drains: app/drain.py), SIGKILL to its whole group past a deadline; `kill` is
SIGKILL to the whole group at once, as if the machine it ran on died (a replica's engine
core and worker die with it).

A `Replica` keeps its ports for its whole life, restarts included: routers know their
workers by a static URL, and a restarted replica must come back at the same one.

A member runs on every CPU the machine allows (`machine_cpus`), whatever the thread that
starts it is pinned to: a child inherits its parent thread's affinity, and a caller whose
threads are pinned (a server in the same process with `--pin-frontend`, as in the test
suite) otherwise started every replica's engine on the one core it left, where a
restarted replica's worker, starved by the spinning engines already there, took ten
minutes to import vLLM.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.errors import ConfigError
from app.fleet.ports import free_port

# How long a member may take to become ready; an engine's first start compiles.
START_TIMEOUT_S = 600.0
_POLL_S = 0.1
_LOG_TAIL = 3000  # characters of a failed member's log quoted in the error


@functools.cache
def machine_cpus() -> frozenset[int]:
    """The CPUs a process of ours may run on (its cpuset's), however this process's own
    threads are pinned: a thread of its own asks for every CPU and reads what the kernel
    granted (Linux intersects the request with the cpuset)."""
    granted: list[frozenset[int]] = []

    def ask() -> None:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
        granted.append(frozenset(os.sched_getaffinity(0)))

    asker = threading.Thread(target=ask, name="fleet-cpus")
    asker.start()
    asker.join()
    return granted[0]


@dataclass
class Member(ABC):
    """One child process of the fleet."""

    name: str
    workdir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @abstractmethod
    def command(self) -> list[str]: ...

    @abstractmethod
    def ready(self) -> bool:
        """Whether the member answers as ready now (never raises)."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
            )
        # Popen returns once the child has exec'd, before it can start a thread or a
        # process: all it will start inherits this.
        os.sched_setaffinity(self.process.pid, machine_cpus())

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if not self.alive:
                code = self.process.returncode if self.process is not None else None
                raise ConfigError(f"{self.name} exited ({code}) before it was ready{self._tail()}")
            if time.monotonic() > deadline:
                raise ConfigError(f"{self.name} was not ready in {timeout_s:.0f} s{self._tail()}")
            time.sleep(_POLL_S)

    def terminate(self, group: bool = False) -> None:
        """SIGTERM to the member (a replica begins its drain), or to its whole process
        group (as systemd's stop or a terminal's Ctrl-C would), if it runs."""
        if self.alive and self.process is not None:
            if group:
                os.killpg(self.process.pid, signal.SIGTERM)
            else:
                self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float, group: bool = False) -> int | None:
        """`terminate`, then SIGKILL to its group if it has not exited in `timeout_s`.
        Returns its exit status (None if it was never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.terminate(group)
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL to the member's whole process group, as if its machine died."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def _tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return ""
        return f"; the end of {self.log}:\n{text}" if text else ""


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Replica(Member):
    """`switchboard serve` with the fleet's flags and its own ports.

    `serve_args` are the replica's own flags (model, engine flags); the fleet adds the
    listening ports, the shared store, vLLM's KV-cache events on a ZMQ port of its own,
    and, on a CPU build, the core its engine's threads are bound to (two CPU engines
    bound to the same core slow each other badly, and an exiting one lingers), with its
    frontend left unpinned: `--pin-frontend` keeps a frontend off its own engine's cores
    only, which with replicas sharing a host puts it on a neighbour's engine core."""

    serve_args: list[str] = field(default_factory=list)
    store: str | None = None
    cpu_core: int | None = None
    port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    kv_events_port: int = field(default_factory=free_port)
    # Its drain's flags (None: serve's defaults). A restart may change them: the new
    # process takes what they are when it starts.
    drain_timeout_s: float | None = None
    drain_grace_s: float | None = None
    # The environment's changes for this replica (None: unset the variable).
    env: dict[str, str | None] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def kv_events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_events_port}"

    def command(self) -> list[str]:
        kv_events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # vLLM's publisher binds only a wildcard endpoint (a named host, it connects
            # to): on every interface, as on a GPU host whose router is elsewhere.
            "endpoint": f"tcp://*:{self.kv_events_port}",
        }
        args = [
            sys.executable, "-m", "app.cli", "serve",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--grpc-port", str(self.grpc_port),
            "--kv-events-config", json.dumps(kv_events),
        ]  # fmt: skip
        if self.store is not None:
            args += ["--responses-store", self.store]  # Salience's store follows it
        if self.drain_timeout_s is not None:
            args += ["--drain-timeout-s", str(self.drain_timeout_s)]
        if self.drain_grace_s is not None:
            args += ["--drain-grace-s", str(self.drain_grace_s)]
        if self.cpu_core is not None:
            args += ["--pin-frontend", "false"]
        return args + self.serve_args

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.cpu_core is not None:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(self.cpu_core))
        for name, value in self.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def ready(self) -> bool:
        return _get_ok(f"{self.url}/ready")

    def model_name(self) -> str:
        """The model it serves (the first of `/v1/models`: the base model)."""
        models = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"]
        return str(models[0]["id"])

    def model_path(self) -> str:
        """The directory of the model it serves (`/v1/models`' root of the base model):
        what a router that tokenizes itself (SMG's gRPC mode) loads."""
        models = httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"]
        return str(models[0]["root"])

    def block_size(self) -> int:
        """Its engine's KV block size, as vLLM reports it (`vllm:cache_config_info`)."""
        found = re.search(r'\bblock_size="(\d+)"', self._metrics("vllm:cache_config_info"))
        if found is None:
            raise ConfigError(f"{self.name} reports no KV block size on /metrics")
        return int(found.group(1))

    def metric(self, name: str, **labels: str) -> float:
        """The sum of its samples of `name` (a counter or gauge on /metrics) whose labels
        include `labels`: what the fleet's tests and benchmarks read off a replica."""
        total = 0.0
        pattern = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$"
        for found in re.finditer(pattern, self._metrics(name), re.M):
            sample = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or ""))
            if all(sample.get(k) == v for k, v in labels.items()):
                total += float(found.group(2))
        return total

    def _metrics(self, name: str) -> str:
        """/metrics, cut to the lines of `name` (it is large)."""
        body = httpx.get(f"{self.url}/metrics", timeout=10).text
        return "\n".join(line for line in body.splitlines() if line.startswith(name))


@dataclass
class RedisServer(Member):
    """Debian's `redis-server` on loopback, nothing persisted: the store replicas share."""

    port: int = field(default_factory=free_port)
    extra: list[str] = field(default_factory=list)  # more of redis-server's flags

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError("redis-server is not installed (scripts/setup installs it)")
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            *self.extra,
        ]  # fmt: skip

    def ready(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True


@dataclass
class Router(Member):
    """A router process, its command line made by `app.fleet.routers`."""

    argv: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    health_path: str = "/health"
    # Variables set in its environment, beside the fleet's own.
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return self.argv

    def environment(self) -> dict[str, str]:
        return {**super().environment(), **self.env}

    def ready(self) -> bool:
        return _get_ok(f"{self.url}{self.health_path}")


@dataclass
class Nginx(Member):
    """nginx in the foreground on a configuration of the fleet's (`routers.nginx_conf`)."""

    conf: str = ""
    port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(binary):
            raise ConfigError("nginx is not installed (scripts/setup installs it)")
        path = self.workdir / "nginx.conf"
        (self.workdir / "temp").mkdir(parents=True, exist_ok=True)  # its buffers' files
        path.write_text(self.conf)
        return [binary, "-c", str(path), "-p", str(self.workdir), "-e", str(self.log)]

    def ready(self) -> bool:
        return _get_ok(f"{self.url}/health")
