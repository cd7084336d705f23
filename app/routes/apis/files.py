"""OpenAI's Files API over HTTP, as the openai SDK's `client.files` calls it: `POST
/v1/files` (multipart: `file`, `purpose` batch, `expires_after[anchor|seconds]`), `GET
/v1/files` (`after`, `limit`, `order`, `purpose`), `GET` and `DELETE /v1/files/{id}`,
`GET /v1/files/{id}/content`.

Thin adapter over `app.batches.files.Files`. An upload is parsed as it arrives, its body
bounded by --batch-max-input-bytes (a `Content-Length` past it is refused before
anything is read, 413; a body that grows past it is cut there, 413), the file spooled to
disk past a megabyte and stored in parts. Errors are OpenAI's shape (this router renders
them with `openai_error`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.responses import Response, StreamingResponse

from app.batches.files import TooLarge
from app.errors import InvalidRequest
from app.protocols.openai.batches import expires_after, file_object
from app.routes.apis.openai import openai_error
from app.routes.deps import AuthDep, BatchesDep, PrincipalDep
from app.routes.http.answers import error_answers
from app.routes.http.errors import api_router
from app.routes.http.json import OrjsonResponse
from schemas.openai_batches import FileDeleted, FileList, FileObject
from schemas.openai_replies import ErrorResponse

router = api_router(openai_error, dependencies=[AuthDep])

_ERRORS = error_answers(
    ErrorResponse, "OpenAI error body", "503: the store is down; 413: the file is too large"
)
# What a multipart body may add to its file (boundaries, part headers, the form fields).
_FORM_SLACK = 64 * 1024
_UPLOAD = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                        "expires_after[seconds]": {"type": "integer"},
                    },
                }
            }
        },
    }
}


async def _bounded(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    seen = 0
    async for data in request.stream():
        seen += len(data)
        if seen > limit:
            raise TooLarge(f"The upload is larger than the bound of {limit} bytes", param="file")
        yield data


async def _form(request: Request, limit: int) -> list[tuple[str, str | UploadFile]]:
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise TooLarge(f"The upload is larger than the bound of {limit} bytes", param="file")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("The body must be multipart/form-data", param="file")
    parser = MultiPartParser(request.headers, _bounded(request, limit), max_files=1, max_fields=8)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"The multipart body is not valid: {exc.message}") from exc
    return list(form.multi_items())


@router.post(
    "/v1/files",
    openapi_extra=_UPLOAD,
    responses={200: {"model": FileObject}, **_ERRORS},
)
async def create_file(request: Request, batches: BatchesDep, principal: PrincipalDep) -> Response:
    files = batches.files
    items = await _form(request, files.max_bytes + _FORM_SLACK)
    fields = {k: v for k, v in items if isinstance(v, str)}
    uploads = [v for _, v in items if not isinstance(v, str)]
    try:
        if len(uploads) != 1 or dict(items).get("file") is not uploads[0]:
            raise InvalidRequest("Upload one file, as the form field `file`", param="file")
        purpose = fields.get("purpose")
        if purpose != "batch":
            raise InvalidRequest(
                f"Invalid purpose {purpose!r}: this server keeps files of purpose 'batch'",
                param="purpose",
            )
        expiry: dict[str, Any] | None = None
        if "expires_after[anchor]" in fields or "expires_after[seconds]" in fields:
            expiry = {
                "anchor": fields.get("expires_after[anchor]"),
                "seconds": fields.get("expires_after[seconds]"),
            }
        upload = uploads[0]
        doc = await files.upload(
            principal.tenant,
            filename=upload.filename or "upload.jsonl",
            purpose=purpose,
            expires_s=expires_after(expiry, "expires_after"),
            read=upload.read,
            quota=principal.limits.uploaded_bytes,
        )
    finally:
        for upload in uploads:
            await upload.close()
    return OrjsonResponse(file_object(doc))


@router.get("/v1/files", responses={200: {"model": FileList}, **_ERRORS})
async def list_files(
    batches: BatchesDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> Response:
    docs, more = await batches.files.page(
        principal.tenant, after=after, limit=limit, desc=order == "desc", purpose=purpose
    )
    data = [file_object(d) for d in docs]
    return OrjsonResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


@router.get("/v1/files/{file_id}", responses={200: {"model": FileObject}, **_ERRORS})
async def retrieve_file(file_id: str, batches: BatchesDep, principal: PrincipalDep) -> Response:
    return OrjsonResponse(file_object(await batches.files.get(principal.tenant, file_id)))


@router.delete("/v1/files/{file_id}", responses={200: {"model": FileDeleted}, **_ERRORS})
async def delete_file(file_id: str, batches: BatchesDep, principal: PrincipalDep) -> Response:
    await batches.files.delete(principal.tenant, file_id)
    return OrjsonResponse({"id": file_id, "object": "file", "deleted": True})


_CONTENT = {
    200: {
        "description": "The file's bytes (a batch's output: JSONL, one line per request)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    **_ERRORS,
}


@router.get("/v1/files/{file_id}/content", response_class=Response, responses=_CONTENT)
async def file_content(file_id: str, batches: BatchesDep, principal: PrincipalDep) -> Response:
    files = batches.files
    doc = await files.get(principal.tenant, file_id)
    parts: AsyncIterator[bytes] = files.content(doc)
    return StreamingResponse(parts, media_type="application/octet-stream")
