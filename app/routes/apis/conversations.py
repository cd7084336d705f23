"""The OpenAI Conversations API over HTTP: `/v1/conversations` (create), `/{id}`
(retrieve, update, delete) and `/{id}/items` (add, list; `/{item_id}`: retrieve, delete),
as the openai SDK's `client.conversations` calls them.

Thin adapter over `app.sessions.conversations.Conversations`: the body is read, the call
made, the answer sent as JSON. Errors are OpenAI's shape with `param` (this router renders
them with `openai_error`): 400 for a body or an item that is not right, 404 for an unknown
conversation or item, 503 `store_unavailable` when the store cannot be reached, 429
`store_full` for what the store's bound cannot hold.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query, Request
from starlette.responses import Response

from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, ConversationsDep, PrincipalDep
from app.routes.http.bodies import documented, json_body, read_body
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from schemas.openai_conversations import (
    Conversation,
    ConversationCreate,
    ConversationDeleted,
    ConversationItemList,
    ConversationItemsCreate,
    ConversationUpdate,
)
from schemas.openai_replies import ErrorResponse

router = api_router(openai_error, dependencies=[AuthDep])

_ERROR_BODY = {"application/json": {"schema": documented(ErrorResponse)}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"description": "OpenAI error body", "content": _ERROR_BODY},
    "5XX": {"description": "OpenAI error body (503: the store is down)", "content": _ERROR_BODY},
}
_ITEM = {"description": "The item", "content": {"application/json": {"schema": {"type": "object"}}}}
Includable = Annotated[list[str] | None, Query()]  # accepted; nothing to add to an item


@router.post(
    "/v1/conversations",
    openapi_extra=json_body(ConversationCreate),
    responses={200: {"model": Conversation}, **_ERRORS},
)
async def create_conversation(
    request: Request, conversations: ConversationsDep, principal: PrincipalDep
) -> Response:
    body = await read_body(request, ConversationCreate)
    return OrjsonResponse(await conversations.create(principal, body.items, body.metadata))


@router.get(
    "/v1/conversations/{conversation_id}", responses={200: {"model": Conversation}, **_ERRORS}
)
async def retrieve_conversation(
    conversation_id: str, conversations: ConversationsDep, principal: PrincipalDep
) -> Response:
    return OrjsonResponse(await conversations.retrieve(principal, conversation_id))


@router.post(
    "/v1/conversations/{conversation_id}",
    openapi_extra=json_body(ConversationUpdate),
    responses={200: {"model": Conversation}, **_ERRORS},
)
async def update_conversation(
    conversation_id: str, request: Request, conversations: ConversationsDep, principal: PrincipalDep
) -> Response:
    body = await read_body(request, ConversationUpdate)
    return OrjsonResponse(await conversations.update(principal, conversation_id, body.metadata))


@router.delete(
    "/v1/conversations/{conversation_id}",
    responses={200: {"model": ConversationDeleted}, **_ERRORS},
)
async def delete_conversation(
    conversation_id: str, conversations: ConversationsDep, principal: PrincipalDep
) -> Response:
    return OrjsonResponse(await conversations.delete(principal, conversation_id))


@router.post(
    "/v1/conversations/{conversation_id}/items",
    openapi_extra=json_body(ConversationItemsCreate),
    responses={200: {"model": ConversationItemList}, **_ERRORS},
)
async def add_items(
    conversation_id: str,
    request: Request,
    conversations: ConversationsDep,
    principal: PrincipalDep,
    include: Includable = None,
) -> Response:
    body = await read_body(request, ConversationItemsCreate)
    return OrjsonResponse(await conversations.add_items(principal, conversation_id, body.items))


@router.get(
    "/v1/conversations/{conversation_id}/items",
    responses={200: {"model": ConversationItemList}, **_ERRORS},
)
async def list_items(
    conversation_id: str,
    conversations: ConversationsDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    include: Includable = None,
) -> Response:
    page = await conversations.list_items(
        principal, conversation_id, after=after, limit=limit, order=order
    )
    return OrjsonResponse(page)


@router.get(
    "/v1/conversations/{conversation_id}/items/{item_id}", responses={200: _ITEM, **_ERRORS}
)
async def retrieve_item(
    conversation_id: str,
    item_id: str,
    conversations: ConversationsDep,
    principal: PrincipalDep,
    include: Includable = None,
) -> Response:
    return OrjsonResponse(await conversations.item(principal, conversation_id, item_id))


@router.delete(
    "/v1/conversations/{conversation_id}/items/{item_id}",
    responses={200: {"model": Conversation}, **_ERRORS},
)
async def delete_item(
    conversation_id: str, item_id: str, conversations: ConversationsDep, principal: PrincipalDep
) -> Response:
    return OrjsonResponse(await conversations.delete_item(principal, conversation_id, item_id))
