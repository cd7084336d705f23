"""/v1/messages on the wire, against the live engine: the stream's exact event order,
the key, admission's refusals, a draining server, a bug, an error after the first byte,
and clients that go away (tests/aborts.py).

Auth, overload and drain need settings of their own: `small_server` serves another app
on the live engine and its loop (`create_app(settings, engine=live.engine)`), so no
second engine starts and the shared live server is never drained.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam

from tests.aborts import WORKERS, AbortWatch, Workload
from tests.conftest import LiveServer, free_port
from tests.error_bodies import body_of

pytestmark = pytest.mark.e2e

USER: list[MessageParam] = [{"role": "user", "content": "Write a long story."}]


def _events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event; every event must be named."""
    out = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(lines) == {"event", "data"}, block
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"], block
        out.append((lines["event"], data))
    return out


def test_the_stream_on_the_wire(live_server: LiveServer) -> None:
    """message_start (with the usage of the prompt), ping, one text block opened,
    deltas, closed, message_delta with the stop and the whole usage, message_stop; each
    event named as its data's type."""
    body = {"model": live_server.model, "max_tokens": 5, "messages": USER, "stream": True}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
    url = f"{live_server.base_url}/v1/messages?beta=true"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response.read().decode())
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) == {"content_block_delta"}, names
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert set(start["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert all(data["index"] == 0 for _, data in events[2:-2])
    final = events[-2][1]
    assert final["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert final["usage"]["input_tokens"] == start["usage"]["input_tokens"]
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    assert final["usage"]["output_tokens"] <= 5


@contextmanager
def small_server(live: LiveServer, **settings: Any) -> Iterator[tuple[str, Any]]:
    """(base URL, app) of an app with `settings` on the live engine, on its loop."""
    config = live.app.state.settings.model_copy(
        update={"port": free_port(), "grpc_port": 0, **settings}
    )
    with live.another_app(config) as app:
        yield f"http://127.0.0.1:{config.port}", app


def _client(base_url: str, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, max_retries=0, **kwargs)


def test_the_key(live_server: LiveServer) -> None:
    """`x-api-key` (what Claude Code sends) or a bearer token (the SDK's `api_key` and
    `auth_token`); anything else is the SDK's AuthenticationError, on every route here
    (count_tokens, an unknown path under /v1/messages) and before the body is read."""
    request: dict[str, Any] = {"model": live_server.model, "max_tokens": 2, "messages": USER}
    with small_server(live_server, api_key="sk-right") as (url, _):
        for good in (
            _client(url, api_key="sk-right"),
            _client(url, auth_token="sk-right"),
            _client(url, api_key=None, auth_token=None, default_headers={"x-api-key": "sk-right"}),
        ):
            with good:
                assert good.messages.create(**request).content
        for wrong in (_client(url, api_key="sk-wrong"), _client(url, auth_token="sk-wrong")):
            with wrong, pytest.raises(anthropic.AuthenticationError) as refused:
                wrong.messages.create(**request)
            assert refused.value.body == {
                "type": "error",
                "error": {"type": "authentication_error", "message": "Missing or invalid API key"},
            }
        for path in ("/v1/messages/count_tokens", "/v1/messages/batches", "/v1/messages"):
            response = httpx.post(url + path, content=b"not json", timeout=30)
            assert response.status_code == 401, path
            assert response.json()["error"]["type"] == "authentication_error"
        # The other APIs keep their own key check: x-api-key is Anthropic's only.
        models = httpx.get(url + "/v1/models", headers={"x-api-key": "sk-right"}, timeout=30)
        assert models.status_code == 401


def test_a_full_queue_is_overloaded_and_the_sdk_retries(live_server: LiveServer) -> None:
    """At the queue bound: 529 `overloaded_error` with Retry-After (the SDK's
    OverloadedError); once the queue has room, the SDK's own retry after Retry-After gets
    through. Counted as refusals of the protocol `anthropic` on /metrics."""
    request: dict[str, Any] = {"model": live_server.model, "max_tokens": 2, "messages": USER}
    with small_server(live_server, max_queued_requests=1) as (url, app):
        admission = app.state.admission

        async def occupy() -> Any:
            return admission.admit("openai")

        ticket = live_server.call(occupy())
        with _client(url, api_key="k") as client, pytest.raises(anthropic.OverloadedError) as full:
            client.messages.create(**request)
        assert full.value.status_code == 529
        assert int(full.value.response.headers["retry-after"]) >= 1
        assert body_of(full.value)["error"]["type"] == "overloaded_error"

        async def release_later() -> None:
            live_server.loop.call_later(0.3, ticket.release)

        live_server.call(release_later())
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=3) as patient:
            assert patient.messages.create(**request).content
        metrics = httpx.get(url + "/metrics", timeout=30).text
        refused = re.search(
            r'^switchboard_refused_total\{protocol="anthropic"\} (\S+)$', metrics, re.M
        )
        assert refused and float(refused.group(1)) >= 2


def test_a_draining_server_is_unavailable(live_server: LiveServer) -> None:
    """Draining: 503 (the SDK's ServiceUnavailableError) with Retry-After, not 529."""
    with small_server(live_server) as (url, app):
        app.state.drain.begin()
        with (
            _client(url, api_key="k") as client,
            pytest.raises(anthropic.ServiceUnavailableError) as refused,
        ):
            client.messages.create(model=live_server.model, max_tokens=2, messages=USER)
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert body_of(refused.value)["error"]["type"] == "overloaded_error"


def test_a_bug_is_an_api_error(live_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug of ours: 500 `api_error` with an error id only (the SDK's
    InternalServerError); streamed, after the first byte, an `error` event ends the
    stream (the SDK raises it), and the connection stays usable."""
    from app.protocols.anthropic.exchange import MessagesExchange

    def broken(self: Any) -> Any:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(MessagesExchange, "result", broken)
    monkeypatch.setattr(MessagesExchange, "closing", broken)
    request: dict[str, Any] = {"model": live_server.model, "max_tokens": 3, "messages": USER}
    with _client(live_server.base_url, api_key="k") as client:
        with pytest.raises(anthropic.InternalServerError) as failed:
            client.messages.create(**request)
        assert failed.value.status_code == 500
        error = body_of(failed.value)["error"]
        assert error["type"] == "api_error" and "error id" in error["message"]
        assert "secret" not in error["message"]
        with (
            pytest.raises(anthropic.APIStatusError) as in_stream,
            client.messages.stream(**request) as stream,
        ):
            for _ in stream:
                pass
        assert body_of(in_stream.value)["error"]["type"] == "api_error"
        monkeypatch.undo()
        assert client.messages.create(**request).content


def test_a_drain_cut_ends_a_stream_with_an_error_event(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    """A stream still running when the drain's timeout runs out: its engine request is
    aborted and the stream's last event is `error` (overloaded_error), after the deltas
    it had; the engine holds nothing afterwards."""
    body = {
        "model": live_server.model,
        "max_tokens": abort_workload.max_tokens,
        "messages": [{"role": "user", "content": abort_workload.texts[0]}],  # runs long
        "stream": True,
        "temperature": 0,
    }
    with (
        small_server(live_server, drain_timeout_s=0.0) as (url, app),
        httpx.stream("POST", url + "/v1/messages", json=body, timeout=120) as response,
    ):
        lines = response.iter_lines()
        seen = []
        for line in lines:
            seen.append(line)
            if line == "event: content_block_delta":
                break

        async def drain() -> None:
            await app.state.drain.run(live_server.engine.abort)

        live_server.call(drain())
        raw = "\n".join(seen) + "\n" + "\n".join(lines)
    events = _events(raw + "\n\n")
    assert events[-1][0] == "error", [name for name, _ in events]
    assert events[-1][1]["error"]["type"] == "overloaded_error"
    assert live_server.wait_idle() == 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_clients_that_go_away_abort_their_requests(
    live_server: LiveServer, abort_workload: Workload, stream: bool
) -> None:
    """The abort workload as one Messages call per prompt (the same user messages, so the
    same chat-templated prompts, greedy, so as long: tests/aborts.py); the clients go away
    once the engine holds all of it, and the engine must be idle well before the
    workload could have ended by itself."""
    async with httpx.AsyncClient(
        base_url=live_server.base_url, timeout=120, limits=httpx.Limits(max_connections=WORKERS)
    ) as client:
        watch = await AbortWatch.start(live_server.engine, abort_workload)

        async def one(text: str) -> None:
            body = {
                "model": live_server.model,
                "max_tokens": abort_workload.max_tokens,
                "temperature": 0,
                "messages": [{"role": "user", "content": text}],
                "stream": stream,
            }
            if stream:
                async with client.stream("POST", "/v1/messages", json=body) as response:
                    assert response.status_code == 200
                    async for _ in response.aiter_lines():
                        pass
            else:
                await client.post("/v1/messages", json=body)

        await watch.leave([asyncio.create_task(one(text)) for text in abort_workload.texts])
    await watch.idle()
