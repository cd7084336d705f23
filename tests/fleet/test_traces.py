"""One trace from a router to the engine: a call with a caller's `traceparent` through
vllm-router (its tracing on, tests/fleet_setup.py) reaches a replica, and the receiver
gets, in the caller's trace, the router's span, the replica's span under it, and vLLM's
engine span (`llm_request`) under that; the caller's `x-request-id` is the replica's
request id and begins the engine's.

How these fail: a router that starts a new trace or drops the context (our span's parent
is not the router's), a replica that does not take the context, an engine span missing
or not under ours.
"""

from __future__ import annotations

import secrets

import httpx
import pytest

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_MODEL
from tests.otlp_receiver import Span, session_receiver, traceparent

pytestmark = pytest.mark.e2e

CALLER = "00f067aa0ba902b7"
ENGINE_SPAN = "llm_request"
# vllm-router 0.1.17 exports its spans in batches of 64 only (app/fleet/traced_router.py):
# calls enough to fill one after the call traced (each makes two spans).
BATCH_FILL = 40


def _call(url: str) -> tuple[str, str]:
    trace_id = secrets.token_hex(16)
    request_id = f"fleet-{trace_id[:8]}"
    body = {
        "model": LIVE_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    headers = {"traceparent": traceparent(trace_id, CALLER), "x-request-id": request_id}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == request_id
    return trace_id, request_id


def _one_trace(trace_id: str, router: str) -> tuple[list[Span], Span, Span]:
    """The router's spans, ours and vLLM's, once all came."""

    def complete(spans: list[Span]) -> bool:
        services = {s.service for s in spans}
        return (
            router in services
            and "switchboard" in services
            and any(s.name == ENGINE_SPAN for s in spans)
        )

    spans = session_receiver().trace(trace_id, f"{router}'s, our and vLLM's spans", complete, 60)
    (ours,) = [s for s in spans if s.service == "switchboard"]
    (engine,) = [s for s in spans if s.name == ENGINE_SPAN]
    return [s for s in spans if s.service == router], ours, engine


def _check(router_spans: list[Span], ours: Span, engine: Span, request_id: str) -> None:
    by_id = {s.span_id: s for s in router_spans}
    assert ours.parent_id in by_id, "our span is not under the router's"
    chain = [by_id[ours.parent_id]]
    while chain[-1].parent_id in by_id:
        chain.append(by_id[chain[-1].parent_id])
    assert chain[-1].parent_id == CALLER, "the router's spans are not under the caller's"
    assert ours.name == f"chat {LIVE_MODEL}" and ours.kind == 2
    assert ours.attributes["switchboard.request_id"] == request_id
    assert engine.parent_id == ours.span_id
    assert engine.attributes["gen_ai.request.id"].startswith(f"{request_id}-")


def test_through_vllm_router(fleet: Fleet) -> None:
    url = fleet.router("vllm-router").url
    trace_id, request_id = _call(url)
    for _ in range(BATCH_FILL):
        _call(url)
    router_spans, ours, engine = _one_trace(trace_id, "vllm-router")
    _check(router_spans, ours, engine, request_id)
    kinds = {s.kind for s in router_spans}
    assert kinds == {2, 3}, kinds  # its SERVER span, and its CLIENT span to the replica
