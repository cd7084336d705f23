"""The OpenAI Responses API over HTTP: POST /v1/responses, GET (and replay with
`?stream=true`) / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel, GET
/v1/responses/{id}/input_items. (Its websocket mode, on GET /v1/responses:
`app.routes.ws.responses`.)

Thin adapter over `app.sessions.responses.Responses`: the body is read, the model looked
up, the call admitted and planned (503 + Retry-After, 400, 404 before anything runs),
then answered on the shared road (`app.routes.http.calls.answer_call`) as JSON or as SSE
with named events (`event: <type>`, no `[DONE]`). Errors are OpenAI's shape, with
`param` (this router renders them with `openai_error`). A client that goes away aborts a
foreground call's engine request; a background run is not tied to its connection.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from starlette.responses import Response

from app.admission import Tickets
from app.protocols.exchange import Event
from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, EngineDep, PrincipalDep, ResponsesDep
from app.routes.http.answers import Answers, error_answers, event_stream
from app.routes.http.bodies import documented, json_body, read_body
from app.routes.http.calls import answer_call
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from app.routes.http.sse import EventStream, sse
from app.telemetry.http import record_of
from schemas.openai_replies import ErrorResponse
from schemas.openai_responses import (
    STREAM_EVENTS,
    ResponseObject,
    ResponsesDeleted,
    ResponsesInputItemList,
    ResponsesRequest,
)

router = api_router(openai_error, dependencies=[AuthDep])

_ERRORS = error_answers(
    ErrorResponse, "OpenAI error body", "503: overloaded, draining, or the store is down"
)


def _answers(description: str, *, stream: bool = False) -> Answers:
    content: dict[str, Any] = {"application/json": {"schema": documented(ResponseObject)}}
    if stream:
        content.update(event_stream(*STREAM_EVENTS, named=True))
    return {200: {"description": description, "content": content}, **_ERRORS}


async def _sse(events: AsyncIterator[Event]) -> AsyncGenerator[bytes, None]:
    async for name, body in events:
        yield sse(body, name)


@router.post(
    "/v1/responses",
    openapi_extra=json_body(ResponsesRequest),
    responses=_answers(
        "The response object; with `stream: true` server-sent events, each `event: <type>` "
        "and `data: <event>` (an error after the first event: `error` then "
        "`response.failed`); no `[DONE]`",
        stream=True,
    ),
)
async def create_response(
    request: Request, engine: EngineDep, responses: ResponsesDep, principal: PrincipalDep
) -> Response:
    body = await read_body(request, ResponsesRequest)
    call = await responses.start(principal, body, record_of(request))
    if body.background:
        queued = await responses.runs.start(principal, call)
        if body.stream:  # follows the run; leaving does not cancel it
            events = await responses.runs.replay(principal, queued["id"], None)
            return EventStream(_sse(events), Tickets(()))
        return OrjsonResponse(queued)
    hooks = responses.hooks(principal, call, body, None)
    return await answer_call(request, engine, call, stream=body.stream, hooks=hooks)


@router.get(
    "/v1/responses/{response_id}",
    responses=_answers(
        "The stored response; with `stream=true` its events (live while it runs on this "
        "server, else replayed), after `starting_after`",
        stream=True,
    ),
)
async def retrieve_response(
    response_id: str,
    responses: ResponsesDep,
    principal: PrincipalDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Response:
    if stream:
        events = await responses.runs.replay(principal, response_id, starting_after)
        return EventStream(_sse(events), Tickets(()))
    return OrjsonResponse((await responses.runs.current(principal, response_id)).response)


@router.delete(
    "/v1/responses/{response_id}",
    responses={200: {"model": ResponsesDeleted}, **_ERRORS},
)
async def delete_response(
    response_id: str, responses: ResponsesDep, principal: PrincipalDep
) -> Response:
    return OrjsonResponse(await responses.delete(principal, response_id))


@router.post(
    "/v1/responses/{response_id}/cancel",
    responses=_answers("The background response, cancelled (or as it ended)"),
)
async def cancel_response(
    response_id: str, responses: ResponsesDep, principal: PrincipalDep
) -> Response:
    return OrjsonResponse(await responses.runs.cancel(principal, response_id))


@router.get(
    "/v1/responses/{response_id}/input_items",
    responses={200: {"model": ResponsesInputItemList}, **_ERRORS},
)
async def list_input_items(
    response_id: str,
    responses: ResponsesDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    page = await responses.records.input_items(
        principal, response_id, after=after, limit=limit, order=order
    )
    return OrjsonResponse(page)
