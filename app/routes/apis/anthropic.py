"""Anthropic's Messages API over HTTP: POST /v1/messages and /v1/messages/count_tokens,
and Anthropic's error answer, which every route here renders its errors with (auth, a
body that does not parse, a wrong method, a refusal, a bug of ours); any other path
under /v1/messages/ (Anthropic's batches, say) is Anthropic's `not_found_error`.

Thin adapter: body -> `app.routes.http.calls.serve_call` (admission: one unit, its bound
the body's texts, before any templating, a refusal a 529 with Retry-After; the exchange built
in the prompt thread, where every client mistake is found before a stream starts; the
engine; JSON or named SSE events). A client that goes away aborts its engine request.
The key is `x-api-key` or a bearer token (`app.routes.deps.require_x_api_key`); query
strings (Claude Code's `?beta=true`) and the `anthropic-version` / `anthropic-beta`
headers are accepted and change nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from app.admission import ProtocolName
from app.engine.models import served_by
from app.errors import InvalidRequest, NotFound, SwitchboardError
from app.protocols.anthropic.errors import error_body, error_kind
from app.protocols.anthropic.exchange import MessagesExchange
from app.protocols.anthropic.messages import admission_bound, conversation
from app.protocols.conversation.plan import template_conversation
from app.routes.deps import AdmissionDep, EngineDep, XApiKeyAuthDep, principal_on
from app.routes.http.answers import Answers, error_answers, event_stream
from app.routes.http.bodies import json_body, read_body
from app.routes.http.calls import serve_call
from app.routes.http.errors import api_router, retry_headers
from app.routes.http.json import OrjsonResponse
from app.sessions.calls import admitted_in_prompt_thread
from schemas.anthropic import AnthropicCountTokensRequest, AnthropicMessagesRequest
from schemas.anthropic_replies import (
    STREAM_EVENTS,
    AnthropicCountTokensResponse,
    AnthropicErrorResponse,
    AnthropicMessageOut,
)

_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")


def anthropic_error(
    error: SwitchboardError, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """`error` as Anthropic answers it: `{"type": "error", "error": {"type", "message"}}`
    with Anthropic's status (`status`: a framework error's own, 404 or 405, kept)."""
    _, own = error_kind(error)
    return OrjsonResponse(
        error_body(error), status_code=status or own, headers=retry_headers(error, headers)
    )


router = api_router(anthropic_error, dependencies=[XApiKeyAuthDep])

_ERRORS = error_answers(
    AnthropicErrorResponse,
    "Anthropic error body",
    "529: overloaded, retry after Retry-After s; 503: draining, likewise",
)


def _answers(model: type[BaseModel], stream: bool = False) -> Answers:
    ok: dict[str, Any] = {"model": model}
    if stream:
        ok["description"] = (
            f"`{model.__name__}`, or with `stream: true` server-sent events, each "
            "`event: <type>` with `data: <its JSON>`: message_start, ping, "
            "content_block_start / _delta / _stop per block, message_delta, message_stop "
            "(an error after the first event: `event: error`, which ends the stream)"
        )
        ok["content"] = event_stream(*STREAM_EVENTS, named=True)
    return {200: ok, **_ERRORS}


@router.post(
    "/v1/messages",
    openapi_extra=json_body(AnthropicMessagesRequest),
    responses=_answers(AnthropicMessageOut, stream=True),
)
async def messages(request: Request, engine: EngineDep, admission: AdmissionDep) -> Response:
    body = await read_body(request, AnthropicMessagesRequest)
    served = served_by(engine, body.model)
    message_id = f"msg_{uuid.uuid4().hex}"
    return await serve_call(
        request,
        engine,
        admission,
        protocol=ProtocolName.ANTHROPIC,
        units=[admission_bound(body)],
        priority=0,
        stream=body.stream,
        build=lambda: MessagesExchange(
            body, engine.info, engine.tokenizer, message_id=message_id, served=served
        ),
    )


@router.post(
    "/v1/messages/count_tokens",
    openapi_extra=json_body(AnthropicCountTokensRequest),
    responses=_answers(AnthropicCountTokensResponse),
)
async def count_tokens(request: Request, engine: EngineDep, admission: AdmissionDep) -> Response:
    """The prompt's tokens as /v1/messages renders the same body (its `input_tokens`
    plus its cache reads); admitted as the call's prompt work is."""
    body = await read_body(request, AnthropicCountTokensRequest)
    lora = served_by(engine, body.model).lora_name
    info, tokenizer = engine.info, engine.tokenizer

    def count() -> int:
        call = conversation(body, info, request_id="count_tokens", lora_name=lora)
        return len(template_conversation(call, info, tokenizer).prompt_token_ids)

    tokens = await admitted_in_prompt_thread(
        admission,
        protocol=ProtocolName.ANTHROPIC,
        units=[admission_bound(body)],
        principal=principal_on(request),
        build=count,
    )
    return OrjsonResponse({"input_tokens": tokens})


@router.api_route(
    "/v1/messages/{rest:rest}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
)
async def elsewhere(request: Request) -> Response:
    """Anthropic's other Messages routes (batches, ...) are not served: its 404, and a
    wrong method on a route that is served its 405."""
    if request.url.path in _ROUTES:
        error = InvalidRequest(
            f"Method not allowed: {request.method} {request.url.path}", code="method_not_allowed"
        )
        return anthropic_error(error, 405, {"Allow": "POST"})
    raise NotFound(f"No route for {request.method} {request.url.path}")
