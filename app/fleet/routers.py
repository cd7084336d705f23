"""The routers' command lines and nginx's configuration: every flag the fleet gives them,
in one place (docs/operations.md, "Scale beyond one machine", says why each is set).

Both routers probe each replica's `/ready` (not their default `/health`, which stays 200
while a replica drains) every `probe_interval_s` (their default is 60 s), so that a
draining replica leaves the rotation within `probe_interval_s x failures` of SIGTERM,
inside the replica's `--drain-grace-s`, while its listener still answers.

Traced (`traces`: an OTLP receiver's HOST:PORT), each exports its own spans there and
sends their W3C context on to the replica: SMG with `--enable-trace
--otlp-traces-endpoint` and a log filter that keeps its spans (`smg_env`), vllm-router
through `app.fleet.traced_router` (its command line has no flag for it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from app.fleet.members import Replica
from app.fleet.ports import free_port

VLLM_ROUTER = "vllm-router"
SMG = "smg"
SMG_GRPC = "smg-grpc"  # SMG in its gRPC mode: it tokenizes, the replicas move token ids
ROUTERS = (VLLM_ROUTER, SMG, SMG_GRPC)
VLLM_ROUTER_POLICIES = (
    "round_robin",
    "power_of_two",
    "cache_aware",
    "kv_aware",
    "consistent_hash",
    "sticky_least_loaded",
    "random",
)
SMG_POLICIES = (
    "round_robin",
    "power_of_two",
    "cache_aware",
    "least_load",
    "consistent_hashing",
    "prefix_hash",
    "random",
)


@dataclass(frozen=True)
class Probe:
    """How a router probes its replicas' readiness."""

    interval_s: int = 1
    failures: int = 2  # consecutive failed probes before a replica is out
    successes: int = 1  # consecutive good probes before it is back
    timeout_s: int = 2

    @property
    def out_within_s(self) -> float:
        """How long after a replica turns not-ready it may still be sent work."""
        return float(self.interval_s * self.failures + self.timeout_s)


@dataclass(frozen=True)
class KvIdentity:
    """What `kv_aware` must know of the engines whose KV-cache events it reads: the model
    they serve (its cache identity) and their KV block size (it hashes the request's
    tokens in blocks of that size, as the events carry them)."""

    model: str
    block_size: int


def _binary(name: str) -> str:
    # Installed beside this interpreter by the project's set-up (pyproject's dev extra).
    return str(Path(sys.executable).parent / name)


def vllm_router_argv(
    replicas: list[Replica],
    policy: str,
    port: int,
    probe: Probe,
    kv: KvIdentity | None = None,
    traces: str | None = None,
) -> list[str]:
    """vLLM's router (`vllm-router`, PyPI) in front of `replicas`. Under `kv_aware` (`kv`
    given) it reads each replica's KV-cache events (vLLM's ZMQ publisher, which every
    fleet replica runs)."""
    start = [_binary(VLLM_ROUTER)]
    if traces is not None:
        start = [sys.executable, "-m", "app.fleet.traced_router", "--otlp-traces-endpoint", traces]
    argv = [
        *start,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *(r.url for r in replicas),
        "--policy", policy,
        *probe_flags(probe),
        "--prometheus-port", str(free_port()),
        "--log-level", "warning",
    ]  # fmt: skip
    if kv is not None:
        for replica in replicas:
            argv += ["--kv-event-source", f"{replica.url}={replica.kv_events_endpoint}"]
        argv += ["--kv-event-block-size", str(kv.block_size), "--kv-event-model", kv.model]
    return argv


def smg_argv(
    replicas: list[Replica], policy: str, port: int, probe: Probe, traces: str | None = None
) -> list[str]:
    """The Shepherd Model Gateway (`smg`, PyPI) in front of `replicas`."""
    tracing = [] if traces is None else ["--enable-trace", "--otlp-traces-endpoint", traces]
    return [
        _binary(SMG), "launch", *tracing,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *(r.url for r in replicas),
        "--policy", policy,
        *probe_flags(probe),
        "--prometheus-port", str(free_port()),
        "--log-level", "warn",
    ]  # fmt: skip


def smg_env(traces: str | None) -> dict[str, str]:
    """SMG's environment beside its command line. Traced, its log filter lets its span
    through: SMG makes its span of a request (`http_request`, target `smg::otel-trace`)
    at INFO, and the filter its `--log-level` sets (or `RUST_LOG`, which replaces it)
    drops spans below that level as it drops log lines. At `--log-level warn` SMG 1.13
    made no span, exported nothing and sent the caller's own `traceparent` on unchanged
    (measured); `RUST_LOG` here keeps its log at warn and its spans at INFO."""
    return {} if traces is None else {"RUST_LOG": "warn,smg::otel-trace=info"}


def smg_grpc_argv(
    replicas: list[Replica], policy: str, port: int, probe: Probe, model_path: str
) -> list[str]:
    """SMG in its gRPC mode in front of `replicas`' gRPC ports (their
    `vllm.grpc.engine.VllmEngine` service): it renders chat templates, tokenizes and parses
    tool calls itself, from the model directory at `model_path` (the replicas'), and probes
    each replica with the service's HealthCheck, which a draining replica fails."""
    return [
        _binary(SMG), "launch",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *(f"grpc://{r.grpc_target}" for r in replicas),
        "--model-path", model_path,
        "--policy", policy,
        *probe_flags(probe),
        "--prometheus-port", str(free_port()),
        "--log-level", "warn",
    ]  # fmt: skip


def probe_flags(probe: Probe) -> list[str]:
    """The probes, and what the router does with a request a replica refused (a draining
    one's 503) or could not take (a dead one's closed port): try again, on whichever
    replica the policy picks, for longer than the probes take to put the replica out
    (both routers' 5 attempts over 0.4 s failed a request whose every attempt landed on a
    draining replica, once in a roll, measured). Their circuit breakers are off: opened
    by the same few seconds of failures, they held a replica out for 60 s whatever its
    probes said once it was back, where the probes alone already take a failing replica
    out (a dead engine answers /ready 503 too)."""
    attempts, waited, wait = 1, 0.0, _RETRY_FIRST_S
    while waited * (1 - _RETRY_JITTER) < probe.out_within_s:
        attempts, waited, wait = attempts + 1, waited + wait, min(wait * 1.5, _RETRY_MAX_S)
    return [
        "--health-check-endpoint", "/ready",
        "--health-check-interval-secs", str(probe.interval_s),
        "--health-failure-threshold", str(probe.failures),
        "--health-success-threshold", str(probe.successes),
        "--health-check-timeout-secs", str(probe.timeout_s),
        "--retry-max-retries", str(attempts),
        "--retry-initial-backoff-ms", str(int(_RETRY_FIRST_S * 1000)),
        "--retry-max-backoff-ms", str(int(_RETRY_MAX_S * 1000)),
        "--retry-backoff-multiplier", "1.5",
        "--disable-circuit-breaker",
    ]  # fmt: skip


# A retry's first wait and its longest (both routers wait 1.5x longer each time, give or
# take their default jitter of a fifth).
_RETRY_FIRST_S = 0.2
_RETRY_MAX_S = 1.0
_RETRY_JITTER = 0.2


def nginx_conf(replicas: list[Replica], port: int, grpc_port: int, workdir: Path) -> str:
    """nginx for what the routers do not carry: websockets (Evergreen, Salience), native
    gRPC (h2c), GraphPipe and the playground, round-robin over the replicas, each new
    connection (or gRPC call) to the next. Salience sessions live in the replicas'
    shared store, so any replica serves any call; an Evergreen session is its
    connection, and stays on the replica that accepted it."""
    http = "\n".join(f"        server {r.url.removeprefix('http://')};" for r in replicas)
    grpc = "\n".join(f"        server {r.grpc_target};" for r in replicas)
    temp = workdir / "temp"
    return f"""\
worker_processes 1;
daemon off;
pid {workdir / "nginx.pid"};
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    client_max_body_size 64m;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}
    upstream replicas {{
{http}
    }}
    upstream replicas_grpc {{
{grpc}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            # The Host as the browser sent it, port included: a replica's origin check
            # (--allowed-origins) knows the playground's page by it.
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
            # A replica that refuses (draining) or is gone: the next one, for requests
            # that have not been sent yet.
            proxy_next_upstream error timeout http_503;
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2;
        location / {{
            grpc_pass grpc://replicas_grpc;
            grpc_read_timeout 1h;
            grpc_send_timeout 1h;
            grpc_next_upstream error timeout;
        }}
    }}
}}
"""
