"""Keys, tenants and roles on the fake engine (`app.auth`, `app.tenants`): which key makes
which principal, with which limits; that every transport decides it where the request
enters (HTTP, Anthropic's `x-api-key`, GraphPipe, the websockets, gRPC's metadata); that
only control-plane (or full) keys reach the routes that change the server, and runtime
LoRA loading is off unless asked for and confined to its root, with one message for
every path it refuses."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi.testclient import TestClient

from app.admission import clamp_priority
from app.auth import INVALID_KEY, Keyring
from app.cli import _settings_parser
from app.config import Settings
from app.errors import ConfigError, Unauthenticated
from app.main import create_app
from app.routes.grpc.calls import principal, with_principal
from app.tenants import DEFAULT_TENANT, OTHER_TENANTS, Limits, Principal, Role, parse_limits
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import free_port
from tests.fake_engine import FakeEngine
from tests.waits import until

KEYS: dict[str, Any] = {
    "api_key": "full",
    "tenant_api_key": ["acme:acme-key", "beta:beta-key"],
    "control_plane_api_keys": ["ops-key"],
}


def _settings(**more: Any) -> Settings:
    return Settings(model="fake", **more)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- who a key is ------------------------------------------------------------------------


def test_no_key_configured_every_caller_is_the_default_tenant_with_full_rights() -> None:
    keyring = Keyring.from_settings(_settings())
    assert keyring.keyless
    for offered in (None, "", "anything"):
        caller = keyring.authenticate(offered)
        assert (caller.tenant, caller.role) == (DEFAULT_TENANT, Role.FULL)
        assert caller.serves and caller.controls


def test_each_key_makes_its_principal_and_any_other_one_answer() -> None:
    keyring = Keyring.from_settings(_settings(**KEYS))
    made = {
        key: (keyring.authenticate(key).tenant, keyring.authenticate(key).role)
        for key in ("full", "acme-key", "beta-key", "ops-key")
    }
    assert made == {
        "full": (DEFAULT_TENANT, Role.FULL),
        "acme-key": ("acme", Role.TENANT),
        "beta-key": ("beta", Role.TENANT),
        "ops-key": (DEFAULT_TENANT, Role.CONTROL_PLANE),
    }
    refusals = set()
    for offered in (None, "", "acme", "acme:acme-key", "acme-key ", "ACME-KEY", "full-"):
        with pytest.raises(Unauthenticated) as refused:
            keyring.authenticate(offered)
        refusals.add((refused.value.message, refused.value.code))
    assert refusals == {(INVALID_KEY, "invalid_api_key")}


def test_roles() -> None:
    keyring = Keyring.from_settings(_settings(**KEYS))
    tenant, ops, full = (keyring.authenticate(k) for k in ("acme-key", "ops-key", "full"))
    assert (tenant.serves, tenant.controls) == (True, False)
    assert (ops.serves, ops.controls) == (False, True)
    assert (full.serves, full.controls) == (True, True)


def test_the_same_key_twice_stops_the_start() -> None:
    with pytest.raises(ConfigError, match="twice"):
        Keyring.from_settings(_settings(api_key="k", tenant_api_key=["a:k"]))


def test_limits_default_to_an_equal_share_of_the_servers_bounds() -> None:
    alone = Keyring.from_settings(_settings(api_key="k")).authenticate("k").limits
    settings = _settings()
    assert alone == Limits(
        priority=0,
        concurrent=0,
        sessions=settings.salience_max_sessions,
        session_tokens=settings.salience_max_total_tokens,
        stored_bytes=settings.responses_store_max_bytes,
        uploaded_bytes=settings.batch_store_max_bytes,
    )
    # Three tenants: the default one (--api-key), acme and beta.
    shared = Keyring.from_settings(_settings(**KEYS)).authenticate("acme-key").limits
    assert shared == Limits(
        priority=0,
        concurrent=settings.max_queued_requests // 3,
        sessions=settings.salience_max_sessions // 3,
        session_tokens=settings.salience_max_total_tokens // 3,
        stored_bytes=settings.responses_store_max_bytes // 3,
        uploaded_bytes=settings.batch_store_max_bytes // 3,
    )


def test_tenant_limits_override_the_defaults() -> None:
    keyring = Keyring.from_settings(
        _settings(
            **KEYS,
            tenant_limits=["*:sessions=10,priority=5", "acme:priority=-3,stored_bytes=99"],
        )
    )
    acme, beta = keyring.authenticate("acme-key").limits, keyring.authenticate("beta-key").limits
    assert (acme.priority, acme.sessions, acme.stored_bytes) == (-3, 10, 99)
    assert (beta.priority, beta.sessions) == (5, 10)
    ceiling = keyring.authenticate("acme-key").limits.priority
    assert (clamp_priority(-10, ceiling), clamp_priority(7, ceiling)) == (-3, 7)


@pytest.mark.parametrize(
    "entry", ["acme", ":sessions=1", "acme:nope=1", "acme:sessions=x", "acme:sessions=-1"]
)
def test_bad_tenant_limits_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_limits(entry)
    with pytest.raises(ValueError):
        _settings(tenant_limits=[entry])


def test_metric_labels_name_configured_tenants_only() -> None:
    tenants = Keyring.from_settings(_settings(**KEYS)).tenants
    assert [tenants.label(t) for t in ("acme", DEFAULT_TENANT, "mallory")] == [
        "acme",
        DEFAULT_TENANT,
        OTHER_TENANTS,
    ]


def test_keys_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--model", "m", "--tenant-api-key", "a:1", "--tenant-api-key", "b:2"]
    argv += ["--control-plane-api-keys", "x", "y", "--tenant-limits", "a:sessions=1,priority=2"]
    known, _ = _settings_parser().parse_known_args(argv)
    given = {k: v for k, v in vars(known).items() if v is not None and k != "help"}
    flags = Settings(**given)
    assert flags.tenant_api_key == ["a:1", "b:2"]
    assert flags.control_plane_api_keys == ["x", "y"]
    assert flags.tenant_limits == ["a:sessions=1,priority=2"]
    monkeypatch.setenv("SWITCHBOARD_TENANT_API_KEY", "a:1, b:2")
    monkeypatch.setenv("SWITCHBOARD_CONTROL_PLANE_API_KEYS", '["x", "y"]')
    monkeypatch.setenv("SWITCHBOARD_TENANT_LIMITS", "a:sessions=1,priority=2 *:concurrent=4")
    env = Settings(model="m")
    assert env.tenant_api_key == ["a:1", "b:2"]
    assert env.control_plane_api_keys == ["x", "y"]
    assert env.tenant_limits == ["a:sessions=1,priority=2", "*:concurrent=4"]
    monkeypatch.setenv("SWITCHBOARD_TENANT_API_KEY", "no-colon")
    with pytest.raises(ValueError, match="TENANT_ID:KEY"):
        Settings(model="m")


# -- every transport decides it where the request enters ---------------------------------


def _client(**settings: Any) -> httpx.AsyncClient:
    app = create_app(_settings(**settings), engine=FakeEngine())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_http_no_key_no_service_and_a_control_plane_key_serves_nothing() -> None:
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with _client(**KEYS) as c:
        for headers in ({}, _bearer("wrong")):
            refused = await c.post("/v1/chat/completions", json=chat, headers=headers)
            assert refused.status_code == 401
            assert refused.json()["error"]["message"] == INVALID_KEY
        ops = await c.post("/v1/chat/completions", json=chat, headers=_bearer("ops-key"))
        assert ops.status_code == 403 and ops.json()["error"]["type"] == "permission_error"
        for key in ("acme-key", "full"):
            served = await c.post("/v1/chat/completions", json=chat, headers=_bearer(key))
            assert served.status_code == 200, served.text
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/version")).status_code == 200


async def test_anthropic_and_graphpipe_take_tenant_keys_too() -> None:
    message = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with _client(**KEYS) as c:
        served = await c.post("/v1/messages", json=message, headers={"x-api-key": "acme-key"})
        assert served.status_code == 200, served.text
        ops = await c.post("/v1/messages", json=message, headers={"x-api-key": "ops-key"})
        assert ops.status_code == 403 and ops.json()["error"]["type"] == "permission_error"
        assert (await c.get("/graphpipe", headers=_bearer("beta-key"))).status_code == 200
        assert (await c.get("/graphpipe", headers=_bearer("ops-key"))).status_code == 403
        assert (await c.get("/graphpipe")).status_code == 401


def test_websockets_refuse_a_control_plane_key_at_the_upgrade() -> None:
    with TestClient(create_app(_settings(**KEYS), engine=FakeEngine())) as c:
        with c.websocket_connect("/salience/ws?token=ops-key") as ws:
            assert ws.receive_json()["error"]["code"] == "PERMISSION_DENIED"
        with c.websocket_connect("/salience/ws?token=acme-key") as ws:
            ws.send_json({"id": "1", "method": "OpenSession", "request": {"model": "fake"}})
            assert "sessionId" in ws.receive_json()["response"]


@contextmanager
def _grpc_app(**settings: Any) -> Iterator[grpc.Channel]:
    port = free_port()
    app = create_app(_settings(grpc_port=port, **settings), engine=FakeEngine())
    with TestClient(app), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel


def test_grpc_metadata_decides_the_call_and_a_control_plane_key_serves_nothing() -> None:
    with _grpc_app(**KEYS) as channel:
        salience = salience_grpc.SalienceStub(channel)
        request = pb.OpenSessionRequest(model="fake")
        for metadata, code in (
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer wrong"),), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer ops-key"),), grpc.StatusCode.PERMISSION_DENIED),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                salience.OpenSession(request, metadata=metadata, timeout=10)
            assert refused.value.code() == code
        acme = (("authorization", "Bearer acme-key"),)
        assert salience.OpenSession(request, metadata=acme, timeout=10).session_id


async def test_a_grpc_handler_runs_with_the_principal_its_interceptor_decided() -> None:
    caller = Principal("acme", Role.TENANT, Limits(), "acme")
    seen: list[str] = []

    async def unary(request: bytes, context: Any) -> bytes:
        seen.append(principal().tenant)
        return request

    async def streaming(request: bytes, context: Any) -> AsyncIterator[bytes]:
        seen.append(principal().tenant)
        yield request

    handlers: list[grpc.RpcMethodHandler[Any, Any]] = [
        grpc.unary_unary_rpc_method_handler(unary),
        grpc.unary_stream_rpc_method_handler(streaming),
    ]
    for handler in handlers:
        wrapped = with_principal(handler, caller)
        behaviour: Any = wrapped.unary_unary or wrapped.unary_stream
        # Each call in a task of its own, as grpcio runs it.
        if wrapped.unary_unary is not None:
            await asyncio.create_task(behaviour(b"x", None))
        else:

            async def drain(stream: Any) -> None:
                async for _ in stream(b"x", None):
                    pass

            await asyncio.create_task(drain(behaviour))
    assert seen == ["acme", "acme"]


# -- the control plane ---------------------------------------------------------------------


def _adapter(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "adapter_config.json").write_text("{}")
    return root / name


async def test_only_control_plane_keys_change_the_server(tmp_path: Path) -> None:
    _adapter(tmp_path, "a1")
    runtime = {"allow_runtime_lora_updating": True, "lora_root": tmp_path}
    load = {"lora_name": "a1", "lora_path": "a1"}
    async with _client(**KEYS, **runtime) as c:
        for key in ("acme-key", "beta-key"):
            refused = await c.post("/v1/load_lora_adapter", json=load, headers=_bearer(key))
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["type"] == "permission_error"
        assert (await c.post("/v1/load_lora_adapter", json=load)).status_code == 401
        loaded = await c.post("/v1/load_lora_adapter", json=load, headers=_bearer("ops-key"))
        assert loaded.status_code == 200, loaded.text
        unload = {"lora_name": "a1"}
        refused = await c.post("/v1/unload_lora_adapter", json=unload, headers=_bearer("acme-key"))
        assert refused.status_code == 403
        for key in ("full", "ops-key"):
            done = await c.post("/v1/unload_lora_adapter", json=unload, headers=_bearer(key))
            assert done.status_code == (200 if key == "full" else 404)


async def test_runtime_lora_loading_is_off_unless_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _adapter(tmp_path, "a1")
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    load = {"lora_name": "a1", "lora_path": str(tmp_path / "a1")}
    async with _client(lora_root=tmp_path) as c:
        for route, body in (("load", load), ("unload", {"lora_name": "a1"})):
            off = await c.post(f"/v1/{route}_lora_adapter", json=body)
            assert off.status_code == 404 and off.json()["error"]["code"] == "runtime_lora_off"
    # vLLM's own variable asks for it as well as our flag.
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    async with _client(lora_root=tmp_path) as c:
        assert (await c.post("/v1/load_lora_adapter", json=load)).status_code == 200
    with pytest.raises(ValueError, match="needs --lora-root"):
        _settings()


async def test_runtime_lora_loading_is_confined_to_its_root_with_one_message(
    tmp_path: Path,
) -> None:
    root, elsewhere = tmp_path / "loras", tmp_path / "elsewhere"
    _adapter(root, "good")
    outside = _adapter(elsewhere, "outside")
    (root / "link").symlink_to(outside)  # a link out of the root
    (root / "empty").mkdir()  # a directory with no adapter_config.json
    (root / "file").write_text("{}")
    refused_paths = [
        str(outside),  # an adapter outside the root, absolute
        "../elsewhere/outside",  # and by way of `..`
        "link",  # and by way of a link
        "/etc",  # a directory that exists
        "/no/such/dir",  # one that does not
        "missing",
        "empty",
        "file",
        "good/../../elsewhere/outside",
        "good\x00",
    ]
    runtime = {"allow_runtime_lora_updating": True, "lora_root": root}
    async with _client(**runtime) as c:
        answers = set()
        for number, path in enumerate(refused_paths):
            body = {"lora_name": f"x{number}", "lora_path": path}
            refused = await c.post("/v1/load_lora_adapter", json=body)
            assert refused.status_code == 400, (path, refused.text)
            error = refused.json()["error"]
            answers.add((error["message"], error["param"]))
        assert len(answers) == 1, answers
        assert str(tmp_path) not in next(iter(answers))[0]
        for path in ("good", str(root / "good"), os.path.join("good", ".")):
            body = {"lora_name": f"ok-{len(path)}", "lora_path": path}
            assert (await c.post("/v1/load_lora_adapter", json=body)).status_code == 200


# -- what a tenant stores is its own: Salience, both transports ----------------------------


def test_salience_sessions_are_their_tenants_on_the_websocket_and_grpc() -> None:
    port = free_port()
    app = create_app(_settings(grpc_port=port, **KEYS), engine=FakeEngine())
    with TestClient(app) as c, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with c.websocket_connect("/salience/ws?token=acme-key") as ws:
            ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
            sid = ws.receive_json()["response"]["sessionId"]
        unknown = "0" * 24
        # Over the websocket: beta (and the default tenant) find nothing by acme's id,
        # with the answer an id never opened gets.
        for key in ("beta-key", "full"):
            with c.websocket_connect(f"/salience/ws?token={key}") as ws:
                answers = []
                for session_id in (sid, unknown):
                    for method, request in (
                        ("DumpSession", {"sessionId": session_id}),
                        ("ForkSession", {"sessionId": session_id, "atPosition": 0}),
                        ("Generate", {"sessionId": session_id, "appendTokens": [1]}),
                    ):
                        ws.send_json({"id": "x", "method": method, "request": request})
                        error = ws.receive_json()["error"]
                        answers.append((error["code"], error["message"].replace(session_id, "")))
                assert set(answers) == {("NOT_FOUND", answers[0][1])}, answers
                ws.send_json({"id": "c", "method": "CloseSession", "request": {"sessionId": sid}})
                assert ws.receive_json() == {"id": "c", "response": {}}
        # Over gRPC: the same for beta; acme's own calls find it, from either transport.
        salience = salience_grpc.SalienceStub(channel)
        beta = (("authorization", "Bearer beta-key"),)
        for session_id in (sid, unknown):
            with pytest.raises(grpc.RpcError) as missing:
                salience.DumpSession(pb.DumpSessionRequest(session_id=session_id), metadata=beta)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            stream = salience.Generate(
                pb.GenerateRequest(session_id=session_id, append_tokens=[1], max_tokens=1),
                metadata=beta,
            )
            with pytest.raises(grpc.RpcError) as missing:
                list(stream)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        acme = (("authorization", "Bearer acme-key"),)
        events = list(
            salience.Generate(
                pb.GenerateRequest(session_id=sid, append_tokens=[65], max_tokens=1),
                metadata=acme,
                timeout=10,
            )
        )
        assert events[-1].HasField("done")
        dumped = salience.DumpSession(pb.DumpSessionRequest(session_id=sid), metadata=acme)
        assert list(dumped.tokens)[:1] == [65]
        opened = salience.OpenSession(pb.OpenSessionRequest(model="fake"), metadata=beta)
        with c.websocket_connect("/salience/ws?token=acme-key") as ws:
            ws.send_json(
                {"id": "d", "method": "DumpSession", "request": {"sessionId": opened.session_id}}
            )
            assert ws.receive_json()["error"]["code"] == "NOT_FOUND"


# -- what a tenant stores is its own: the Responses and Conversations APIs -----------------

ACME, BETA, FULL = _bearer("acme-key"), _bearer("beta-key"), _bearer("full")
UNKNOWN_RESPONSE, UNKNOWN_CONVERSATION = "resp_" + "0" * 48, "conv_" + "0" * 48


def _same_answer(
    theirs: httpx.Response, unknown: httpx.Response, theirs_id: str, unknown_id: str
) -> None:
    """Another tenant's id answers as an id never stored: 404, the same body but the id."""
    assert theirs.status_code == unknown.status_code == 404, (theirs.text, unknown.text)
    assert theirs.text.replace(theirs_id, "<id>") == unknown.text.replace(unknown_id, "<id>")


async def test_stored_responses_are_their_tenants_on_every_route(tmp_path: Path) -> None:
    store = str(tmp_path / "r.sqlite3")
    async with _client(**KEYS, responses_store=store) as c:
        made = await c.post(
            "/v1/responses",
            json={"model": "fake", "input": "hi", "max_output_tokens": 3},
            headers=ACME,
        )
        assert made.status_code == 200, made.text
        rid = made.json()["id"]
        routes: list[tuple[str, str, Any]] = [
            ("GET", "/v1/responses/{}", None),
            ("GET", "/v1/responses/{}?stream=true", None),
            ("GET", "/v1/responses/{}/input_items", None),
            ("POST", "/v1/responses/{}/cancel", None),
            ("DELETE", "/v1/responses/{}", None),
        ]
        for headers in (BETA, FULL):
            for method, path, _ in routes:
                theirs = await c.request(method, path.format(rid), headers=headers)
                unknown = await c.request(method, path.format(UNKNOWN_RESPONSE), headers=headers)
                _same_answer(theirs, unknown, rid, UNKNOWN_RESPONSE)
            chained = {"model": "fake", "input": "and?", "max_output_tokens": 2}
            theirs = await c.post(
                "/v1/responses", json={**chained, "previous_response_id": rid}, headers=headers
            )
            unknown = await c.post(
                "/v1/responses",
                json={**chained, "previous_response_id": UNKNOWN_RESPONSE},
                headers=headers,
            )
            _same_answer(theirs, unknown, rid, UNKNOWN_RESPONSE)
            assert theirs.json()["error"]["code"] == "previous_response_not_found"
            compact = {"model": "fake", "input": "sum up"}
            theirs = await c.post(
                "/v1/responses/compact",
                json={**compact, "previous_response_id": rid},
                headers=headers,
            )
            unknown = await c.post(
                "/v1/responses/compact",
                json={**compact, "previous_response_id": UNKNOWN_RESPONSE},
                headers=headers,
            )
            _same_answer(theirs, unknown, rid, UNKNOWN_RESPONSE)
        # Untouched by the others: acme reads, chains on and deletes it.
        assert (await c.get(f"/v1/responses/{rid}", headers=ACME)).json()["id"] == rid
        items = await c.get(f"/v1/responses/{rid}/input_items", headers=ACME)
        assert items.status_code == 200 and items.json()["data"]
        follow = await c.post(
            "/v1/responses",
            json={"model": "fake", "input": "and?", "previous_response_id": rid},
            headers=ACME,
        )
        assert follow.status_code == 200, follow.text
        compacted = await c.post(
            "/v1/responses/compact",
            json={"model": "fake", "input": "sum up", "previous_response_id": rid},
            headers=ACME,
        )
        assert compacted.status_code == 200, compacted.text
        assert (await c.delete(f"/v1/responses/{rid}", headers=ACME)).status_code == 200


async def test_a_background_run_is_its_tenants(tmp_path: Path) -> None:
    store = str(tmp_path / "r.sqlite3")
    engine = FakeEngine(step_delay=0.01)
    app = create_app(_settings(**KEYS, responses_store=store), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        body = {"model": "fake", "input": "a story", "max_output_tokens": 400, "background": True}
        queued = await c.post("/v1/responses", json=body, headers=ACME)
        rid = queued.json()["id"]
        for path in ("/v1/responses/{}/cancel", "/v1/responses/{}"):
            method = "POST" if path.endswith("cancel") else "DELETE"
            theirs = await c.request(method, path.format(rid), headers=BETA)
            unknown = await c.request(method, path.format(UNKNOWN_RESPONSE), headers=BETA)
            _same_answer(theirs, unknown, rid, UNKNOWN_RESPONSE)
        replay = await c.get(f"/v1/responses/{rid}?stream=true", headers=BETA)
        assert replay.status_code == 404
        running = await c.get(f"/v1/responses/{rid}", headers=ACME)
        assert running.json()["status"] in ("queued", "in_progress")  # beta stopped nothing
        cancelled = await c.post(f"/v1/responses/{rid}/cancel", headers=ACME)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


async def test_conversations_are_their_tenants_on_every_route(tmp_path: Path) -> None:
    store = str(tmp_path / "r.sqlite3")
    async with _client(**KEYS, responses_store=store) as c:
        made = await c.post(
            "/v1/conversations",
            json={"items": [{"type": "message", "role": "user", "content": "hello"}]},
            headers=ACME,
        )
        assert made.status_code == 200, made.text
        cid = made.json()["id"]
        listed = await c.get(f"/v1/conversations/{cid}/items", headers=ACME)
        item_id = listed.json()["data"][0]["id"]
        message = {"type": "message", "role": "user", "content": "more"}
        routes: list[tuple[str, str, Any]] = [
            ("GET", "/v1/conversations/{}", None),
            ("POST", "/v1/conversations/{}", {"metadata": {"k": "v"}}),
            ("GET", "/v1/conversations/{}/items", None),
            ("POST", "/v1/conversations/{}/items", {"items": [message]}),
            ("GET", "/v1/conversations/{}/items/" + item_id, None),
            ("DELETE", "/v1/conversations/{}/items/" + item_id, None),
            ("DELETE", "/v1/conversations/{}", None),
        ]
        for headers in (BETA, FULL):
            for method, path, body in routes:
                theirs = await c.request(method, path.format(cid), json=body, headers=headers)
                unknown = await c.request(
                    method, path.format(UNKNOWN_CONVERSATION), json=body, headers=headers
                )
                _same_answer(theirs, unknown, cid, UNKNOWN_CONVERSATION)
            in_it = {"model": "fake", "input": "hi", "max_output_tokens": 2}
            theirs = await c.post(
                "/v1/responses", json={**in_it, "conversation": cid}, headers=headers
            )
            unknown = await c.post(
                "/v1/responses",
                json={**in_it, "conversation": UNKNOWN_CONVERSATION},
                headers=headers,
            )
            _same_answer(theirs, unknown, cid, UNKNOWN_CONVERSATION)
        # Acme's, as it left it.
        still = await c.get(f"/v1/conversations/{cid}/items", headers=ACME)
        assert [i["id"] for i in still.json()["data"]] == [item_id]
        answered = await c.post(
            "/v1/responses",
            json={"model": "fake", "input": "hi", "max_output_tokens": 2, "conversation": cid},
            headers=ACME,
        )
        assert answered.status_code == 200, answered.text


def test_the_responses_websocket_continues_only_from_its_tenants_responses(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "r.sqlite3")
    app = create_app(_settings(**KEYS, responses_store=store), engine=FakeEngine())
    with TestClient(app) as c:
        made = c.post(
            "/v1/responses",
            json={"model": "fake", "input": "hi", "max_output_tokens": 2},
            headers=ACME,
        )
        rid = made.json()["id"]
        create = {"type": "response.create", "model": "fake", "input": "and?"}
        with c.websocket_connect("/v1/responses?token=beta-key") as ws:
            ws.send_json({**create, "previous_response_id": rid})
            error = ws.receive_json()
            assert error["type"] == "error", error
            assert error["error"]["code"] == "previous_response_not_found"
        with c.websocket_connect("/v1/responses?token=acme-key") as ws:
            ws.send_json({**create, "previous_response_id": rid, "max_output_tokens": 2})
            events = [ws.receive_json()]
            while events[-1]["type"] not in ("response.completed", "response.incomplete"):
                assert events[-1]["type"] != "error", events[-1]
                events.append(ws.receive_json())


# -- a tenant's concurrency ----------------------------------------------------------------


def test_admission_bounds_each_tenants_units_in_flight() -> None:
    from app.admission import Admission, ProtocolName
    from app.errors import Overloaded

    admission = Admission(None, None)
    acme = Principal("acme", Role.TENANT, Limits(concurrent=2), "acme")
    beta = Principal("beta", Role.TENANT, Limits(concurrent=2), "beta")
    first = admission.admit(ProtocolName.OPENAI, principal=acme)
    admission.admit(ProtocolName.OPENAI, principal=acme)
    with pytest.raises(Overloaded, match="Your tenant has 2 units"):
        admission.admit(ProtocolName.OPENAI, principal=acme)
    narrow = Principal("beta", Role.TENANT, Limits(concurrent=1), "beta")
    with pytest.raises(Overloaded):  # a call of two units, whole or not at all
        admission.admit_all(ProtocolName.OPENAI, [1, 1], principal=narrow)
    both = admission.admit_all(ProtocolName.OPENAI, [1, 1], principal=beta)  # beta's own room
    assert len(both) == 2
    first.release()
    admission.admit(ProtocolName.OPENAI, principal=acme)  # one left: room again
    assert (
        admission.refused[ProtocolName.OPENAI] == 3 and admission.admitted[ProtocolName.OPENAI] == 5
    )
    unbounded = Principal("default", Role.FULL, Limits(), "default")
    for _ in range(10):
        admission.admit(ProtocolName.OPENAI, principal=unbounded)


async def test_one_tenant_at_its_concurrency_leaves_the_others_room() -> None:
    engine = FakeEngine(step_delay=0.01)
    app = create_app(_settings(**KEYS, tenant_limits=["acme:concurrent=1"]), engine=engine)
    transport = httpx.ASGITransport(app=app)
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        running = asyncio.create_task(c.post("/v1/chat/completions", json=chat, headers=ACME))
        await until(lambda: bool(engine.running), "acme's first chat to run")
        refused = await c.post("/v1/chat/completions", json=chat, headers=ACME)
        assert refused.status_code == 503 and "Retry-After" in refused.headers
        assert "Your tenant" in refused.json()["error"]["message"]
        short = {**chat, "max_tokens": 2}
        served = await c.post("/v1/chat/completions", json=short, headers=BETA)
        assert served.status_code == 200, served.text
        engine.step_delay = 0  # the rest of acme's long chat at once: its room is proved
        assert (await running).status_code == 200
        again = await c.post("/v1/chat/completions", json=short, headers=ACME)
        assert again.status_code == 200  # its place came back with its end


async def test_metrics_count_requests_and_tokens_per_configured_tenant() -> None:
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with _client(**KEYS) as c:
        for headers in (ACME, ACME, BETA, FULL):
            assert (await c.post("/v1/chat/completions", json=chat, headers=headers)).is_success
        text = (await c.get("/metrics")).text
    requests = {
        line.split("tenant=")[1].split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("switchboard_requests_total{")
        and 'api="chat"' in line
        and 'outcome="ok"' in line
    }
    assert requests == {"acme": 2.0, "beta": 1.0, DEFAULT_TENANT: 1.0}
    output = [
        line
        for line in text.splitlines()
        if line.startswith("switchboard_output_tokens_total{") and 'tenant="acme"' in line
    ]
    assert output and float(output[0].rsplit(" ", 1)[1]) == 6.0


def test_a_tenants_batch_work_takes_none_of_its_interactive_places() -> None:
    """Work of the batch lane is bounded by the lane's own width, shared by every tenant:
    a tenant's batch requests in flight leave its `concurrent` places to its interactive
    calls (else its own batch would refuse them)."""
    from app.admission import LANE_PRIORITY, Admission, ProtocolName
    from app.errors import Overloaded

    admission = Admission(None, None)
    acme = Principal("acme", Role.TENANT, Limits(concurrent=1), "acme")
    lane = [
        admission.admit(ProtocolName.BATCH, priority=LANE_PRIORITY, principal=acme)
        for _ in range(5)
    ]
    interactive = admission.admit(ProtocolName.OPENAI, principal=acme)
    with pytest.raises(Overloaded, match="Your tenant has 1 units"):
        admission.admit(ProtocolName.OPENAI, principal=acme)
    for ticket in lane:
        ticket.release()
    with pytest.raises(Overloaded):  # the lane's leaving gave back no interactive place
        admission.admit(ProtocolName.OPENAI, principal=acme)
    # A client asking for the lane's priority is not the lane: it is clamped below it.
    with pytest.raises(Overloaded, match="Your tenant has 1 units"):
        admission.admit(ProtocolName.OPENAI, priority=LANE_PRIORITY, principal=acme)
    interactive.release()
    admission.admit(ProtocolName.OPENAI, priority=LANE_PRIORITY, principal=acme)
