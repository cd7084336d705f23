"""POST /v1/responses/compact over HTTP: a conversation compacted into a window to go on
with (`app.protocols.openai.responses.compaction`).

The summary is one Responses call, run as any other (`ResponsesRunner`: admission, the
stored context of `previous_response_id`, the plan in the render thread, the engine; not
stored), answered as JSON once it has ended. A body without `model` is a 400 (the spec
requires it), every error OpenAI's shape with `param`; a client that goes away aborts the
engine request.
"""

from __future__ import annotations

import time

from fastapi import Request
from starlette.responses import Response

from app.admission import text_tokens_bound
from app.engine.models import resolve_model
from app.errors import client_error
from app.protocols.openai.responses.compaction import compacted, summary_call
from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, EngineDep, ResponsesDep
from app.routes.http.bodies import documented, json_body, read_body
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from schemas.openai_replies import ErrorResponse
from schemas.openai_responses import CompactedResponse, CompactRequest

router = api_router(openai_error, dependencies=[AuthDep])

_ERROR_BODY = {"application/json": {"schema": documented(ErrorResponse)}}


@router.post(
    "/v1/responses/compact",
    openapi_extra=json_body(CompactRequest),
    responses={
        200: {"model": CompactedResponse},
        "4XX": {"description": "OpenAI error body (400: no `model`)", "content": _ERROR_BODY},
        "5XX": {"description": "OpenAI error body (503: overloaded)", "content": _ERROR_BODY},
    },
)
async def compact_response(request: Request, engine: EngineDep, runner: ResponsesDep) -> Response:
    body = await read_body(request, CompactRequest)
    model = resolve_model(body.model, engine.info.model_name, engine.has_model)
    bound = text_tokens_bound(await request.body())
    started = await runner.start(summary_call(body), model=model.name, bound=bound)
    try:
        with started.tickets:
            answer = await unless_disconnected(request.receive, runner.collect(started))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    except Exception as exc:
        raise client_error(exc) from exc
    core = started.core
    conversation = [*core.context, *core.input_items[:-1]]  # the last: the summary request
    return OrjsonResponse(compacted(conversation, answer, created_at=int(time.time())))
