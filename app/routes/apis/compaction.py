"""POST /v1/responses/compact over HTTP: a conversation compacted into a window to go on
with (`app.protocols.openai.responses.compaction`).

The summary is one Responses call on the shared road (`app.sessions.responses`:
admission, the stored context of `previous_response_id`, the plan in the prompt thread,
the engine; not stored), answered as JSON once it has ended. A body without `model` is a
400 (the spec requires it), every error OpenAI's shape with `param`; a client that goes
away aborts the engine request.
"""

from __future__ import annotations

import time

from fastapi import Request
from starlette.responses import Response

from app.protocols.openai.responses.compaction import compacted, summary_call
from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, EngineDep, PrincipalDep, ResponsesDep
from app.routes.http.answers import error_answers
from app.routes.http.bodies import json_body, read_body
from app.routes.http.calls import collect_answer
from app.routes.http.disconnect import CLIENT_GONE, ClientGone
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from app.telemetry.http import record_of
from schemas.openai_replies import ErrorResponse
from schemas.openai_responses import CompactedResponse, CompactRequest

router = api_router(openai_error, dependencies=[AuthDep])


@router.post(
    "/v1/responses/compact",
    openapi_extra=json_body(CompactRequest),
    responses={
        200: {"model": CompactedResponse},
        **error_answers(ErrorResponse, "OpenAI error body (400: no `model`)", "503: overloaded"),
    },
)
async def compact_response(
    request: Request, engine: EngineDep, responses: ResponsesDep, principal: PrincipalDep
) -> Response:
    body = await read_body(request, CompactRequest)
    call = await responses.start(principal, summary_call(body), record_of(request))
    try:
        answer = await collect_answer(request, engine, call)
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    exchange = call.exchange
    conversation = [*exchange.context, *exchange.input_items[:-1]]  # the last: the summary request
    return OrjsonResponse(compacted(conversation, answer, created_at=int(time.time())))
