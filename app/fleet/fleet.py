"""`Fleet`: N replicas, the Redis they share, routers and nginx in front, on loopback.

Started in dependency order (Redis, the replicas side by side, then the routers, which
probe replicas that are ready, then nginx) and stopped in reverse: the fronts first, so
no new work arrives, then each replica's drain, then Redis. `restart(i)` is one step of a
rolling restart: the replica drains (or is killed), comes back on the same ports, and is
ready before it returns; the routers take it back on their own probes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from app.config import Settings
from app.errors import ConfigError
from app.fleet.members import (
    START_TIMEOUT_S,
    Member,
    Nginx,
    RedisServer,
    Replica,
    Router,
    machine_cpus,
)
from app.fleet.routers import (
    SMG,
    SMG_GRPC,
    VLLM_ROUTER,
    KvIdentity,
    Probe,
    nginx_conf,
    smg_argv,
    smg_env,
    smg_grpc_argv,
    vllm_router_argv,
)

# What a replica's own stop may take past its drain: the engine's shutdown.
_STOP_SLACK_S = 30.0
# A replica's drain where nothing sets one: serve's own.
_SERVE_DRAIN_S: float = Settings.model_fields["drain_timeout_s"].default
_FRONT_STOP_S = 10.0


@dataclass(frozen=True)
class RouterSpec:
    """A router of the fleet: which (`vllm-router` or `smg`), its policy, its port (a
    free one if None)."""

    kind: str = VLLM_ROUTER
    policy: str = "round_robin"
    port: int | None = None


@dataclass
class Fleet:
    """A fleet under `workdir` (logs, Redis's and nginx's files)."""

    workdir: Path
    serve_args: list[str]
    count: int = 2  # replicas
    routers: dict[str, RouterSpec] = field(default_factory=lambda: {"router": RouterSpec()})
    nginx: bool = False
    nginx_ports: tuple[int, int] | None = None  # HTTP and gRPC; free ones if None
    shared_store: bool = True
    probe: Probe = field(default_factory=Probe)
    drain_timeout_s: float = _SERVE_DRAIN_S
    drain_grace_s: float | None = None
    # On a CPU build, bind each replica's engine to a core of its own, in turn.
    bind_cores: bool = True
    # Each replica's environment, changed (None: a variable unset).
    replica_env: dict[str, str | None] = field(default_factory=dict)
    # An OTLP receiver (HOST:PORT) every replica and router sends its spans to; None: off.
    otlp_traces_endpoint: str | None = None

    def __post_init__(self) -> None:
        self._launched = False
        self.redis = RedisServer("redis", self.workdir) if self.shared_store else None
        store = self.redis.url if self.redis is not None else None
        cores = sorted(machine_cpus())
        # The replica's own drain (its grace covers the routers' probes), and traces.
        grace = self.drain_grace_s
        if grace is None:
            grace = self.probe.out_within_s + self.probe.interval_s
        own: list[str] = []
        if self.otlp_traces_endpoint is not None:
            own += ["--otlp-traces-endpoint", self.otlp_traces_endpoint]
        self.replicas = [
            Replica(
                f"replica-{i}",
                self.workdir,
                serve_args=own + self.serve_args,
                store=store,
                cpu_core=cores[i % len(cores)] if self.bind_cores else None,
                drain_timeout_s=self.drain_timeout_s,
                drain_grace_s=grace,
                env=self.replica_env,
            )
            for i in range(self.count)
        ]
        self.fronts: dict[str, Member] = {}
        for name, spec in self.routers.items():
            self._new_router(name, spec)
        if self.nginx:
            nginx = Nginx("nginx", self.workdir)
            if self.nginx_ports is not None:
                nginx.port, nginx.grpc_port = self.nginx_ports
            self.fronts["nginx"] = nginx

    # -- what tests and clients use --------------------------------------------------

    def router(self, name: str = "router") -> Router:
        front = self.fronts[name]
        assert isinstance(front, Router)
        return front

    @property
    def proxy(self) -> Nginx:
        front = self.fronts.get("nginx")
        if not isinstance(front, Nginx):
            raise ConfigError("this fleet runs no nginx")
        return front

    def replica(self, i: int) -> Replica:
        return self.replicas[i]

    # -- life ------------------------------------------------------------------------

    def launch(self) -> None:
        """Start Redis (ready before anything uses it) and every replica's process,
        without waiting for the replicas: `start` waits. Idempotent."""
        if self._launched:
            return
        self._launched = True
        if self.redis is not None:
            self.redis.start()
            self.redis.wait_ready()
        for replica in self.replicas:
            replica.start()

    def start(self) -> None:
        """`launch`, the replicas ready, then the fronts, each ready."""
        self.launch()
        for replica in self.replicas:
            replica.wait_ready()
        for name, spec in self.routers.items():
            self._start_router(name, spec)
        if self.nginx:
            proxy = self.proxy
            proxy.conf = nginx_conf(self.replicas, proxy.port, proxy.grpc_port, self.workdir)
            proxy.start()
        for front in self.fronts.values():
            front.wait_ready(START_TIMEOUT_S)

    def add_router(self, name: str, spec: RouterSpec) -> Router:
        """Another router in front of the running fleet, ready when it returns."""
        self.routers[name] = spec
        router = self._new_router(name, spec)
        self._start_router(name, spec)
        router.wait_ready(START_TIMEOUT_S)
        return router

    def _new_router(self, name: str, spec: RouterSpec) -> Router:
        router = Router(name, self.workdir)
        router.port = spec.port or router.port
        self.fronts[name] = router
        return router

    def remove_router(self, name: str) -> None:
        self.fronts.pop(name).stop(_FRONT_STOP_S)
        del self.routers[name]

    def _start_router(self, name: str, spec: RouterSpec) -> None:
        router = self.router(name)
        router.argv = self._router_argv(spec, router.port)
        if spec.kind == SMG:
            router.env = smg_env(self.otlp_traces_endpoint)
        router.start()

    def stop(self) -> None:
        """The fronts, then every replica's drain at once, then Redis."""
        for front in self.fronts.values():
            front.stop(_FRONT_STOP_S)
        for replica in self.replicas:
            replica.terminate()
        for replica in self.replicas:
            replica.stop(_stop_s(replica))
        if self.redis is not None:
            self.redis.stop(_FRONT_STOP_S)

    def restart(
        self,
        i: int,
        *,
        kill: bool = False,
        group: bool = False,
        drain_timeout_s: float | None = None,
    ) -> None:
        """Replica `i` drains (SIGTERM, to its whole process group with `group`) or dies
        (SIGKILL to its group), then starts again on the same ports, with
        `drain_timeout_s` as its drain's timeout from then on if given; returns once it
        answers ready."""
        replica = self.replicas[i]
        if kill:
            replica.kill()
        else:
            replica.stop(_stop_s(replica), group)
        if drain_timeout_s is not None:
            replica.drain_timeout_s = drain_timeout_s
        replica.start()
        replica.wait_ready()

    def _router_argv(self, spec: RouterSpec, port: int) -> list[str]:
        if spec.kind == VLLM_ROUTER:
            kv = None
            if spec.policy == "kv_aware":  # the engines' own, read off a replica
                first = self.replicas[0]
                kv = KvIdentity(first.model_name(), first.block_size())
            return vllm_router_argv(
                self.replicas, spec.policy, port, self.probe, kv, self.otlp_traces_endpoint
            )
        if spec.kind == SMG:
            return smg_argv(self.replicas, spec.policy, port, self.probe, self.otlp_traces_endpoint)
        if spec.kind == SMG_GRPC:
            model = self.replicas[0].model_path()
            return smg_grpc_argv(self.replicas, spec.policy, port, self.probe, model)
        raise ConfigError(f"unknown router {spec.kind!r}: one of {VLLM_ROUTER}, {SMG}, {SMG_GRPC}")


@contextmanager
def running(fleet: Fleet) -> Iterator[Fleet]:
    """`fleet` started, and stopped however the block ends (a failed start included)."""
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def _stop_s(replica: Replica) -> float:
    """How long `replica`'s drain may take, its engine's shutdown included."""
    drain = _SERVE_DRAIN_S if replica.drain_timeout_s is None else replica.drain_timeout_s
    return max(drain, replica.drain_grace_s or 0.0) + _STOP_SLACK_S
