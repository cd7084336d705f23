"""Sessions any replica serves, on two real replicas (their own processes and engines)
sharing one redis-server, and what the routers do not carry, through nginx.

Salience (tests/salience_client.py's scenario): a session opened on one replica is
generated in on the other and forked on the first, over websockets and over gRPC; a
Generate running on one makes the session busy on the other, where a CloseSession ends
it. The same scenario through nginx, every call on a connection of its own (a client
that reconnects lands anywhere): both replicas served its Generates. Evergreen, GraphPipe
and the playground through nginx too.

How these fail: a session one replica opened is NOT_FOUND on the other; nginx cannot
carry a socket or a gRPC call to a replica; a call lands on one replica only.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import websockets

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_MODEL
from tests.evergreen_client import outcome
from tests.evergreen_frames import turn
from tests.fleet.conftest import admitted
from tests.fleet_setup import CONTEXT
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.salience_client import (
    busy_across_replicas,
    sessions_across_replicas_grpc,
    sessions_across_replicas_ws,
)

pytestmark = pytest.mark.e2e


def _socket(url: str) -> str:
    return url.replace("http://", "ws://") + "/salience/ws"


async def test_a_salience_session_any_replica_serves(fleet: Fleet) -> None:
    a, b = fleet.replicas
    await sessions_across_replicas_ws([_socket(a.url), _socket(b.url), _socket(a.url)], LIVE_MODEL)
    await sessions_across_replicas_grpc([a.grpc_target, b.grpc_target, a.grpc_target], LIVE_MODEL)
    # Most of the context: a lone Generate that lasts seconds on an idle replica.
    await busy_across_replicas(_socket(a.url), b.grpc_target, LIVE_MODEL, CONTEXT - 64)


async def test_salience_through_nginx_lands_on_every_replica(fleet: Fleet) -> None:
    proxy = fleet.proxy
    before = admitted(fleet, "salience")
    await sessions_across_replicas_ws([_socket(proxy.url)] * 3, LIVE_MODEL)
    target = f"127.0.0.1:{proxy.grpc_port}"
    await sessions_across_replicas_grpc([target] * 3, LIVE_MODEL)
    served = [now - then for now, then in zip(admitted(fleet, "salience"), before, strict=True)]
    assert all(count >= 1 for count in served), served


async def test_evergreen_graphpipe_and_the_playground_through_nginx(fleet: Fleet) -> None:
    proxy = fleet.proxy
    ws_url = proxy.url.replace("http://", "ws://") + "/evergreen/ws"
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps(turn("Hello", 4)))
        kind, text = await outcome(ws)
    assert kind == "text" and text, (kind, text)
    rows = np.array([b"def main():"], dtype=object)
    call = Infer([rows], config=json.dumps({"max_tokens": 3}))
    answer = httpx.post(f"{proxy.url}/graphpipe", content=infer_request(call), timeout=60)
    assert answer.status_code == 200 and not read_infer_response(answer.content).errors
    page = httpx.get(f"{proxy.url}/", timeout=10, follow_redirects=True)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
