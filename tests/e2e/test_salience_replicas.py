"""Salience sessions that any replica serves, on real vLLM: two replicas (apps on the live
server's engine, each with its own port, gRPC port and process state) share one real
redis-server as their session store (`--salience-store`). The scenario of
`tests/salience_client.py` (the one the fleet tests run through a router and a proxy):
a session opened on A is generated in on B and forked on A, over websockets and over
gRPC; a Generate running on A makes the session busy on B, where a CloseSession ends it;
/metrics reports the store's sessions, the same on both replicas.

How these fail: a session one replica opened is NOT_FOUND on the other (the sessions are
per process again), or holds other tokens than the ones the client saw; a second Generate
runs on a busy session; a CloseSession on B leaves A's Generate running to its end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest

from tests.aborts import Workload, busy_engine
from tests.conftest import LiveServer, free_port
from tests.redis_server import redis_server
from tests.salience_client import (
    busy_across_replicas,
    sessions_across_replicas_grpc,
    sessions_across_replicas_ws,
)

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Replica:
    base_url: str
    socket_url: str
    grpc_target: str

    def sessions_held(self) -> float:
        body = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        found = re.search(r'^switchboard_sessions\{protocol="salience"\} (\S+)$', body, re.M)
        assert found is not None, "no session gauge on /metrics"
        return float(found.group(1))


@pytest.fixture(scope="module")
def replicas(
    live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Replica, Replica]]:
    with ExitStack() as stack:
        url = stack.enter_context(redis_server(tmp_path_factory.mktemp("redis")))
        made = []
        for _ in range(2):
            port, grpc_port = free_port(), free_port()
            settings = live_server.app.state.settings.model_copy(
                update={
                    "port": port,
                    "grpc_port": grpc_port,
                    "salience_store": url,
                    "salience_lease_s": 1.0,  # renewed every 0.2 s: a remote close is seen soon
                }
            )
            stack.enter_context(live_server.another_app(settings))
            made.append(
                Replica(
                    f"http://127.0.0.1:{port}",
                    f"ws://127.0.0.1:{port}/salience/ws",
                    f"127.0.0.1:{grpc_port}",
                )
            )
        yield made[0], made[1]


async def test_a_session_is_served_by_any_replica_over_websockets(
    replicas: tuple[Replica, Replica], live_server: LiveServer
) -> None:
    a, b = replicas
    await sessions_across_replicas_ws([a.socket_url, b.socket_url, a.socket_url], live_server.model)
    assert a.sessions_held() == b.sessions_held() == 0  # the store's count, fleet-wide


async def test_a_session_is_served_by_any_replica_over_grpc(
    replicas: tuple[Replica, Replica], live_server: LiveServer
) -> None:
    a, b = replicas
    await sessions_across_replicas_grpc(
        [a.grpc_target, b.grpc_target, a.grpc_target], live_server.model
    )


async def test_a_generate_on_one_replica_makes_the_session_busy_on_the_other(
    replicas: tuple[Replica, Replica], live_server: LiveServer, abort_workload: Workload
) -> None:
    """Beside the abort workload: alone, its 1,000 tokens once ended before the close."""
    a, b = replicas
    async with busy_engine(live_server.engine, live_server.loop, abort_workload):
        await busy_across_replicas(a.socket_url, b.grpc_target, live_server.model, 1000)
    assert live_server.wait_idle() == 0
