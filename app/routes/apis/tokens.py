"""What llm-d's router reads from a vLLM model server besides the OpenAI APIs and their
render routes (`app.routes.apis.openai`): token-in/token-out generation, its abort, and
the operational routes, each as `vllm serve` 0.32 answers it (`--enable-scale-out`,
`--tokens-only`).

- `POST /inference/v1/generate`: `app.protocols.tokens` on the shared road (admission as
  protocol `tokens`, one unit per choice; the exchange built in the prompt thread; JSON, or
  SSE ending `data: [DONE]`; a client that leaves aborts its engine requests). Errors in
  OpenAI's shape, as vLLM answers them.
- `POST /inference/v1/abort_requests` (and `/abort_requests`, the path `--tokens-only`
  also serves): `{"request_ids": [...]}` aborts the running calls of those client ids,
  which end with finish reason "abort" (vLLM's answers 200 and stops nothing: it runs
  them under ids of its own). Only the caller's tenant's calls: another tenant's id is
  answered as an id no call holds (200, nothing stopped). Both paths need a key when
  keys are set (vLLM leaves the second open).
- `GET /load`: `{"server_load": N}`, the requests this server is serving (admitted, not
  yet finished, every protocol), as vLLM's load-aware counter reports its own.
- `GET /kv_event_sources`: the engine's KV-event publisher per data-parallel rank, as
  vLLM's engine client reports it (`{}` without `--kv-events-config`).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from app.admission import ProtocolName
from app.engine.models import served_by
from app.errors import InvalidRequest
from app.protocols.tokens import TokensExchange, TokensRequest, units
from app.routes.apis.openai import openai_error
from app.routes.deps import (
    AdmissionDep,
    AuthDep,
    EngineDep,
    PrincipalDep,
    get_objects,
)
from app.routes.http.answers import Answers, error_answers
from app.routes.http.bodies import json_body, read_body, read_json
from app.routes.http.calls import answer_call
from app.routes.http.errors import api_router
from app.sessions.calls import in_prompt_thread, start_call
from app.telemetry.http import record_of
from schemas.openai_replies import ErrorResponse

PROTOCOL = ProtocolName.TOKENS

router = api_router(openai_error)
guarded = api_router(openai_error, dependencies=[AuthDep])

_ERRORS = error_answers(ErrorResponse, "OpenAI error body", "503: overloaded or draining")


class AbortRequests(BaseModel):
    request_ids: list[str]


def _ok(description: str) -> Answers:
    return {200: {"description": description}, **_ERRORS}


@guarded.post(
    "/inference/v1/generate",
    openapi_extra=json_body(TokensRequest),
    responses=_ok(
        "vLLM's GenerateTokensResponse (or GenerateTextResponse), or with `stream: true` "
        "server-sent events of its stream chunks, ending with `data: [DONE]`"
    ),
)
async def generate(
    request: Request, engine: EngineDep, admission: AdmissionDep, principal: PrincipalDep
) -> Response:
    body = await read_body(request, TokensRequest)
    served = served_by(engine, body.model)
    if served.lora_name is not None:
        raise InvalidRequest("token-in/token-out serves the base model only", param="model")
    info, tokenizer = engine.info, engine.tokenizer
    call = await start_call(
        admission,
        record_of(request),
        protocol=PROTOCOL,
        units=units(body),
        priority=body.priority,
        principal=principal,
        build=lambda: in_prompt_thread(
            lambda: TokensExchange(body, info, tokenizer, model=served.name)
        ),
    )
    get_objects(request.app).named_requests.add(principal.tenant, call.exchange.name, call.tickets)
    return await answer_call(request, engine, call, stream=bool(body.stream))


async def _abort(request: Request, principal: PrincipalDep) -> Response:
    data = await read_json(request)
    ids = data.get("request_ids") if isinstance(data, dict) else None
    if ids is None:
        raise InvalidRequest("Missing 'request_ids' in request body", param="request_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InvalidRequest("request_ids must be a list of strings", param="request_ids")
    await get_objects(request.app).named_requests.abort(principal.tenant, ids)
    return Response(status_code=200)


for path in ("/inference/v1/abort_requests", "/abort_requests"):
    guarded.add_api_route(
        path,
        _abort,
        methods=["POST"],
        response_class=Response,
        openapi_extra=json_body(AbortRequests),
        responses=_ok("an empty body: the named requests are aborted"),
    )


@router.get("/load", responses=_ok('`{"server_load": N}`'))
async def load(request: Request) -> dict[str, int]:
    return {"server_load": get_objects(request.app).admission.in_flight}


@router.get("/kv_event_sources", responses=_ok("the KV-event publishers by rank"))
async def kv_event_sources(engine: EngineDep) -> dict[str, Any]:
    return {str(rank): source for rank, source in engine.kv_event_sources().items()}


router.include_router(guarded)
