"""Anthropic's Message Batches over HTTP, as the anthropic SDK's `client.messages.batches`
calls them: `POST /v1/messages/batches`, `GET /v1/messages/batches` (`after_id`,
`before_id`, `limit`: newest first), `GET` and `DELETE /v1/messages/batches/{id}`, `POST
.../cancel`, `GET .../results` (JSONL, once it has ended).

Thin adapter over `app.batches.service.Batches`. The create body is bounded by
--batch-max-input-bytes (413) and read request by request; what Anthropic refuses at
creation is a 400 here, each request's params are checked when it runs (an `errored`
result). `results_url` is this server's own URL of the results, as the client reached
it. Errors are Anthropic's shape (this router renders them with `anthropic_error`). Its
routes come before `/v1/messages/{rest}` (Anthropic's routes not served).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Query, Request
from starlette.responses import Response, StreamingResponse

from app.errors import InvalidRequest
from app.protocols.anthropic.batches import batch_object
from app.protocols.batches import BatchRecord
from app.routes.apis.anthropic import anthropic_error
from app.routes.deps import BatchesDep, XApiKeyAuthDep, XApiKeyPrincipalDep
from app.routes.http.answers import error_answers
from app.routes.http.bodies import check_json_type, json_body, read_bytes
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from app.store.batches import Tally
from schemas.anthropic_batches import (
    MessageBatch,
    MessageBatchCreate,
    MessageBatchDeleted,
    MessageBatchList,
)
from schemas.anthropic_replies import AnthropicErrorResponse

router = api_router(anthropic_error, dependencies=[XApiKeyAuthDep])

_ERRORS = error_answers(AnthropicErrorResponse, "Anthropic error body", "503: the store is down")
_BATCH = {200: {"model": MessageBatch}, **_ERRORS}
_PATH = "/v1/messages/batches"


def _object(request: Request, record: BatchRecord, tally: Tally) -> dict[str, Any]:
    results_url = f"{str(request.base_url).rstrip('/')}{_PATH}/{record.id}/results"
    return batch_object(record, tally, results_url)


@router.post(_PATH, openapi_extra=json_body(MessageBatchCreate), responses=_BATCH)
async def create_message_batch(
    request: Request, batches: BatchesDep, principal: XApiKeyPrincipalDep
) -> Response:
    # A batch's body is its requests, read as a batch input file is (its own bound, not
    # the JSON APIs'), and declared JSON as theirs are.
    check_json_type(request)
    body = await read_bytes(request, batches.files.max_bytes)
    record = await batches.create_anthropic(principal.tenant, body.joined())
    return OrjsonResponse(_object(request, record, Tally()))


@router.get(_PATH, responses={200: {"model": MessageBatchList}, **_ERRORS})
async def list_message_batches(
    request: Request,
    batches: BatchesDep,
    principal: XApiKeyPrincipalDep,
    after_id: str | None = None,
    before_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> Response:
    if after_id is not None and before_id is not None:
        raise InvalidRequest("Give after_id or before_id, not both", param="before_id")
    if before_id is not None:  # the newer ones next to it, newest first
        page, more = await batches.page(
            principal.tenant, "anthropic", after=before_id, limit=limit, desc=False
        )
        page.reverse()
    else:
        page, more = await batches.page(principal.tenant, "anthropic", after=after_id, limit=limit)
    data = [_object(request, record, tally) for record, tally in page]
    return OrjsonResponse(
        {
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


@router.get(_PATH + "/{batch_id}", responses=_BATCH)
async def retrieve_message_batch(
    request: Request, batch_id: str, batches: BatchesDep, principal: XApiKeyPrincipalDep
) -> Response:
    return OrjsonResponse(
        _object(request, *await batches.load(principal.tenant, batch_id, "anthropic"))
    )


@router.delete(_PATH + "/{batch_id}", responses={200: {"model": MessageBatchDeleted}, **_ERRORS})
async def delete_message_batch(
    batch_id: str, batches: BatchesDep, principal: XApiKeyPrincipalDep
) -> Response:
    await batches.delete_anthropic(principal.tenant, batch_id)
    return OrjsonResponse({"id": batch_id, "type": "message_batch_deleted"})


@router.post(_PATH + "/{batch_id}/cancel", responses=_BATCH)
async def cancel_message_batch(
    request: Request, batch_id: str, batches: BatchesDep, principal: XApiKeyPrincipalDep
) -> Response:
    return OrjsonResponse(
        _object(request, *await batches.cancel(principal.tenant, batch_id, "anthropic"))
    )


_RESULTS = {
    200: {
        "description": "One line per request: `{custom_id, result}`, in the requests' order",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    **_ERRORS,
}


@router.get(_PATH + "/{batch_id}/results", response_class=Response, responses=_RESULTS)
async def message_batch_results(
    batch_id: str, batches: BatchesDep, principal: XApiKeyPrincipalDep
) -> Response:
    record, _ = await batches.load(principal.tenant, batch_id, "anthropic")
    if not record.terminal:
        raise InvalidRequest(
            f"Message batch {batch_id} has not ended yet: its results come when it has"
        )
    lines: AsyncIterator[bytes] = batches.results(record)
    return StreamingResponse(lines, media_type="application/octet-stream")
