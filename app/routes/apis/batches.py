"""OpenAI's Batch API over HTTP, as the openai SDK's `client.batches` calls it: `POST
/v1/batches`, `GET /v1/batches` (`after`, `limit`: newest first), `GET
/v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

Thin adapter over `app.batches.service.Batches`: a batch is created `validating` and
advanced by any replica's runner; what is read is the store's, so any replica answers.
The output and error files are read with the Files API (`app.routes.apis.files`).
Errors are OpenAI's shape (this router renders them with `openai_error`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from starlette.responses import Response

from app.protocols.openai.batches import batch_object
from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, BatchesDep, PrincipalDep
from app.routes.http.answers import error_answers
from app.routes.http.bodies import json_body, read_json
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from app.store.batches import Tally
from schemas.openai_batches import Batch, BatchCreate, BatchList
from schemas.openai_replies import ErrorResponse

router = api_router(openai_error, dependencies=[AuthDep])

_ERRORS = error_answers(ErrorResponse, "OpenAI error body", "503: the store is down")
_BATCH = {200: {"model": Batch}, **_ERRORS}


@router.post("/v1/batches", openapi_extra=json_body(BatchCreate), responses=_BATCH)
async def create_batch(request: Request, batches: BatchesDep, principal: PrincipalDep) -> Response:
    record = await batches.create_openai(principal.tenant, await read_json(request))
    return OrjsonResponse(batch_object(record, Tally()))


@router.get("/v1/batches", responses={200: {"model": BatchList}, **_ERRORS})
async def list_batches(
    batches: BatchesDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    page, more = await batches.page(principal.tenant, "openai", after=after, limit=limit)
    data = [batch_object(record, tally) for record, tally in page]
    return OrjsonResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


@router.get("/v1/batches/{batch_id}", responses=_BATCH)
async def retrieve_batch(batch_id: str, batches: BatchesDep, principal: PrincipalDep) -> Response:
    return OrjsonResponse(batch_object(*await batches.load(principal.tenant, batch_id, "openai")))


@router.post("/v1/batches/{batch_id}/cancel", responses=_BATCH)
async def cancel_batch(batch_id: str, batches: BatchesDep, principal: PrincipalDep) -> Response:
    return OrjsonResponse(batch_object(*await batches.cancel(principal.tenant, batch_id, "openai")))
