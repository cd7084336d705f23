"""The OpenAI Responses API over HTTP: POST /v1/responses, GET (and replay with
`?stream=true`) / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel, GET
/v1/responses/{id}/input_items.

Thin adapter over `app.sessions.responses.ResponsesRunner`: the body is read, the model
looked up, the call admitted and planned (503 + Retry-After, 400, 404 before anything
runs), then answered as JSON or as SSE with named events (`event: <type>`, no `[DONE]`).
Errors are OpenAI's shape, with `param` (this router renders them with `openai_error`).
A client that goes away aborts a foreground call's engine request; a background run is
not tied to its connection.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from starlette.responses import Response

from app.admission import Tickets, text_tokens_bound
from app.engine.base import Engine
from app.errors import ModelNotFound, client_error
from app.protocols.core import Event
from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, EngineDep, ResponsesDep
from app.routes.http.bodies import documented, json_body, read_body
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from app.routes.http.sse import EventStream, sse
from schemas.openai_replies import ErrorResponse
from schemas.openai_responses import (
    STREAM_EVENTS,
    ResponseObject,
    ResponsesDeleted,
    ResponsesInputItemList,
    ResponsesRequest,
)

router = api_router(openai_error, dependencies=[AuthDep])

_ERROR_BODY = {"application/json": {"schema": documented(ErrorResponse)}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"description": "OpenAI error body", "content": _ERROR_BODY},
    "5XX": {
        "description": "OpenAI error body (503: overloaded, draining, or the store is down)",
        "content": _ERROR_BODY,
    },
}
_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "description": "the event's `type`"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": documented(*STREAM_EVENTS),
        },
    },
}


def _answers(description: str, *, stream: bool = False) -> dict[int | str, Any]:
    ok: dict[str, Any] = {"description": description}
    content: dict[str, Any] = {"application/json": {"schema": documented(ResponseObject)}}
    if stream:
        content["text/event-stream"] = {"itemSchema": _EVENT}
    ok["content"] = content
    return {200: ok, **_ERRORS}


def _model(engine: Engine, requested: str | None) -> str:
    # TODO(merge): the one model lookup for every protocol (app/engine/models.py, on its
    # way to main) replaces this; it words the error the same.
    name = requested or engine.info.model_name
    if not engine.has_model(name):
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
    return name


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
async def create_response(request: Request, engine: EngineDep, runner: ResponsesDep) -> Response:
    body = await read_body(request, ResponsesRequest)
    model = _model(engine, body.model)
    bound = text_tokens_bound(await request.body())
    started = await runner.start(body, model=model, bound=bound)
    if body.background:
        try:
            queued = await runner.background(started)
        except BaseException:
            started.tickets.release()
            raise
        if body.stream:  # follows the run; leaving does not cancel it
            events = await runner.replay(queued["id"], None)
            return EventStream(_sse(events), Tickets(()))
        return OrjsonResponse(queued)
    if body.stream:
        return EventStream(_sse(runner.stream(started)), started.tickets)
    try:
        with started.tickets:
            result = await unless_disconnected(request.receive, runner.collect(started))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    except Exception as exc:
        raise client_error(exc) from exc
    return OrjsonResponse(result)


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
    runner: ResponsesDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Response:
    if stream:
        events = await runner.replay(response_id, starting_after)
        return EventStream(_sse(events), Tickets(()))
    return OrjsonResponse(await runner.retrieve(response_id))


@router.delete(
    "/v1/responses/{response_id}",
    responses={200: {"model": ResponsesDeleted}, **_ERRORS},
)
async def delete_response(response_id: str, runner: ResponsesDep) -> Response:
    return OrjsonResponse(await runner.delete(response_id))


@router.post(
    "/v1/responses/{response_id}/cancel",
    responses=_answers("The background response, cancelled (or as it ended)"),
)
async def cancel_response(response_id: str, runner: ResponsesDep) -> Response:
    return OrjsonResponse(await runner.cancel(response_id))


@router.get(
    "/v1/responses/{response_id}/input_items",
    responses={200: {"model": ResponsesInputItemList}, **_ERRORS},
)
async def list_input_items(
    response_id: str,
    runner: ResponsesDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    page = await runner.input_items(response_id, after=after, limit=limit, order=order)
    return OrjsonResponse(page)
