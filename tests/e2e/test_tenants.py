"""Tenants on real vLLM, with real clients: an app with tenant keys on the suite's live
engine (no engine of its own), reached directly and behind the real SMG (1.13, `smg
launch`, with the same `--tenant-api-key` entries).

What SMG forwards (measured: tests/e2e/test_tenants.py and docs/operations.md): the
caller's own `Authorization` header, its own `--api-key` only for its probes and for a
caller that sent none, and no header that names the tenant (a client's
`x-smg-tenant-id` does not reach the replica). So the replica decides the tenant itself
from the forwarded key; nothing forwarded needs trusting.

How these fail: a stored response one tenant made is continued, read or deleted by
another (through SMG or not); a Salience session opened by one tenant is found by
another over the websocket or gRPC; a forged tenant header changes who a caller is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from websockets.sync.client import connect

from app.fleet.members import Router
from app.fleet.routers import SMG
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import LiveServer, free_port
from tests.waits import until_sync

pytestmark = pytest.mark.e2e

ACME, BETA, ROUTER = "acme-key-e2e", "beta-key-e2e", "smg-own-key"
KEYS: dict[str, Any] = {
    # The router's own key is a tenant's of its own: its probes (/v1/models) need a key,
    # and a client sending SMG's key is that tenant, not the default one.
    "tenant_api_key": [f"acme:{ACME}", f"beta:{BETA}", f"smg:{ROUTER}"],
}


@dataclass(frozen=True)
class Replica:
    base_url: str
    grpc_target: str


@pytest.fixture(scope="module")
def replica(live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    """An app with tenant keys on the live engine, served on the live server's loop."""
    store = tmp_path_factory.mktemp("tenants") / "responses.sqlite3"
    settings = live_server.app.state.settings.model_copy(
        update={
            "port": free_port(),
            "grpc_port": free_port(),
            "responses_store": str(store),
            **KEYS,
        }
    )
    with live_server.another_app(settings):
        yield Replica(f"http://127.0.0.1:{settings.port}", f"127.0.0.1:{settings.grpc_port}")


@contextmanager
def smg_in_front(replica_url: str, workdir: Path) -> Iterator[str]:
    """The real SMG in front of `replica_url`, with the same tenant keys; its URL once it
    serves the model."""
    port = free_port()
    argv = [
        str(Path(sys.executable).parent / SMG), "launch",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", replica_url,
        "--policy", "round_robin",
        "--tenant-api-key", f"acme:{ACME}",
        "--tenant-api-key", f"beta:{BETA}",
        "--api-key", ROUTER,
        "--health-check-endpoint", "/health",
        "--prometheus-port", str(free_port()),
        "--log-level", "warn",
    ]  # fmt: skip
    router = Router("smg-tenants", workdir, argv=argv, port=port)
    router.start()
    try:
        router.wait_ready(60)

        def serves_the_model() -> bool:
            try:
                answer = httpx.get(f"{router.url}/v1/models", headers=_bearer(ACME), timeout=2)
            except httpx.HTTPError:
                return False
            return answer.status_code == 200 and bool(answer.json().get("data"))

        until_sync(serves_the_model, "SMG to register the replica", timeout=90)
        yield router.url
    finally:
        router.stop(10)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _client(base_url: str, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base_url}/v1", api_key=key, max_retries=0, default_headers=headers
    )


def test_behind_smg_each_tenant_continues_only_its_own_responses(
    replica: Replica, live_server: LiveServer, tmp_path: Path
) -> None:
    with smg_in_front(replica.base_url, tmp_path) as smg:
        acme, beta = _client(smg, ACME), _client(smg, BETA)
        # SMG checks the key itself (its answer, not the replica's).
        with pytest.raises(openai.AuthenticationError):
            _client(smg, "nobody's").chat.completions.create(
                model=live_server.model, messages=[{"role": "user", "content": "hi"}]
            )
        first = acme.responses.create(model=live_server.model, input="hi", max_output_tokens=3)
        follow = acme.responses.create(
            model=live_server.model,
            input="and?",
            previous_response_id=first.id,
            max_output_tokens=3,
        )
        assert follow.id != first.id
        # Beta through SMG, with or without a forged tenant header: not found, as an id
        # never stored (the replica's answer: SMG carried the request).
        for forged in ({}, {"x-smg-tenant-id": "acme"}):
            with pytest.raises(openai.NotFoundError) as missing:
                _client(smg, BETA, **forged).responses.create(
                    model=live_server.model,
                    input="and?",
                    previous_response_id=first.id,
                    max_output_tokens=3,
                )
            assert missing.value.code == "previous_response_not_found"
        chat = beta.chat.completions.create(
            model=live_server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.choices
    # On the replica itself, what SMG carried was stored as acme's.
    direct = replica.base_url
    assert httpx.get(f"{direct}/v1/responses/{first.id}", headers=_bearer(ACME)).status_code == 200
    for key in (BETA, ROUTER):
        assert (
            httpx.get(f"{direct}/v1/responses/{first.id}", headers=_bearer(key)).status_code == 404
        )
    assert httpx.get(f"{direct}/v1/responses/{first.id}").status_code == 401


def test_salience_sessions_are_their_tenants_on_the_websocket_and_grpc(
    replica: Replica, live_server: LiveServer
) -> None:
    ws_url = replica.base_url.replace("http://", "ws://") + "/salience/ws"
    with connect(f"{ws_url}?token={ACME}") as ws:
        ws.send(
            json.dumps(
                {"id": "o", "method": "OpenSession", "request": {"model": live_server.model}}
            )
        )
        sid = json.loads(ws.recv())["response"]["sessionId"]
        ws.send(
            json.dumps(
                {
                    "id": "g",
                    "method": "Generate",
                    "request": {"sessionId": sid, "appendTokens": [65, 66], "maxTokens": 2},
                }
            )
        )
        while "done" not in json.loads(ws.recv()).get("event", {}):
            pass
    with connect(f"{ws_url}?token={BETA}") as ws:
        ws.send(json.dumps({"id": "d", "method": "DumpSession", "request": {"sessionId": sid}}))
        assert json.loads(ws.recv())["error"]["code"] == "NOT_FOUND"
    with grpc.insecure_channel(replica.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        with pytest.raises(grpc.RpcError) as missing:
            stub.DumpSession(
                pb.DumpSessionRequest(session_id=sid),
                metadata=(("authorization", f"Bearer {BETA}"),),
                timeout=30,
            )
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        dumped = stub.DumpSession(
            pb.DumpSessionRequest(session_id=sid),
            metadata=(("authorization", f"Bearer {ACME}"),),
            timeout=30,
        )
        assert list(dumped.tokens)[:2] == [65, 66] and len(dumped.tokens) >= 3
