"""GraphPipe over HTTP: `POST /graphpipe` (base model) and `POST /graphpipe/{model}` (a LoRA
adapter) take exactly one flatbuffer `Request` and answer an `InferResponse` or a
`MetadataResponse` flatbuffer; `GET` on the same paths answers the metadata as JSON with
a description of how to call them.

Thin adapter: body (at most `settings.graphpipe_max_request_bytes`) -> decode (the body
worker's rule, `app.routes.http.bodies.parsed`: in a worker thread, in a child process
when big; a body decodes to at most its own size, shared strings counted per reference)
-> admission (one unit per batch row, bounded from the input tensor alone; the whole
batch is admitted or refused, 503 + Retry-After) -> exchange (in the prompt thread:
config, constraint, tokenizing, every prompt's fit) -> engine, one generation per prompt,
all at once -> exchange (encode). Nothing of a request's size runs on the event loop.
Every failure of a POST, authentication included, answers an `InferResponse` carrying
one `Error` whose code is also the HTTP status (`graphpipe_error`, the responder this
API's routes carry): never FastAPI's JSON error body, never a bare 500. A prompt that
fails, or a client that disconnects, closes every generation of its batch
(`run_generations`), and closing a generation aborts its engine request.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from app import __version__
from app.admission import ProtocolName, Tickets
from app.engine.base import Engine
from app.engine.models import served_by
from app.errors import SwitchboardError
from app.protocols.graphpipe.decode import InferCall, MetadataCall
from app.protocols.graphpipe.encode import encode_errors, encode_infer_response, encode_metadata
from app.protocols.graphpipe.inference import InferExchange, admission_units
from app.protocols.graphpipe.model import describe
from app.routes.deps import (
    EngineDep,
    SettingsDep,
    get_admission,
    principal_of,
)
from app.routes.http.bodies import documented, parsed, read_bytes
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.errors import api_router, retry_headers
from app.routes.http.json import OrjsonResponse
from app.sessions.calls import in_prompt_thread
from app.sessions.generations import run_generations
from app.telemetry.http import record_of
from schemas.graphpipe_json import GraphPipeErrors, GraphPipeMetadata

OCTET_STREAM = "application/octet-stream"


def graphpipe_error(
    error: SwitchboardError, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """An `InferResponse` holding only `error` as its one `Error`; code = HTTP status."""
    status = status or error.graphpipe_code
    return Response(
        encode_errors([(status, error.message)]),
        status_code=status,
        media_type=OCTET_STREAM,
        headers=retry_headers(error, headers),
    )


router = api_router(graphpipe_error)


def _target(engine: Engine, model: str | None) -> tuple[str, str | None]:
    """(the name the metadata reports, the LoRA adapter to generate with)."""
    served = served_by(engine, model)
    return served.name, served.lora_name


async def _generate(engine: Engine, exchange: InferExchange, tickets: Tickets) -> None:
    """Run every prompt of the batch at once, each on its ticket; the first failure ends
    them all."""
    await run_generations(engine, exchange.requests, tickets, exchange.feed)


def _octet(body: bytes | memoryview, status_code: int = 200) -> Response:
    return Response(body, status_code=status_code, media_type=OCTET_STREAM)


async def _post(request: Request, engine: Engine, limit: int, model: str | None) -> Response:
    """Errors are raised for the route's responder (`graphpipe_error`)."""
    try:
        principal = principal_of(request)
        name, lora = _target(engine, model)
        body = await read_bytes(request, limit)
        call: InferCall | MetadataCall = await parsed(request, "graphpipe", body, max_bytes=limit)
        if isinstance(call, MetadataCall):
            return _octet(encode_metadata(describe(name, __version__, engine.info)))
        units = admission_units(call)
        record = record_of(request)
        admission = get_admission(request)
        with admission.admit_all(
            ProtocolName.GRAPHPIPE, units, record=record, principal=principal
        ) as tickets:
            request_id = f"gp-{uuid.uuid4().hex}"
            exchange = await in_prompt_thread(
                lambda: InferExchange(
                    call, engine.info, engine.tokenizer, request_id=request_id, lora_name=lora
                )
            )
            try:
                await unless_disconnected(request.receive, _generate(engine, exchange, tickets))
                record.last_token_now()
            finally:
                record.count(exchange.accounting)
        return _octet(encode_infer_response(exchange.outputs()))
    except (ClientDisconnect, ClientGone):
        return Response(status_code=CLIENT_GONE)


def _how_to_call(path: str, engine: Engine) -> list[str]:
    adapters = ", ".join(a.name for a in engine.loras()) or "none loaded"
    return [
        f"POST {path} with a body of exactly one GraphPipe `Request` flatbuffer "
        "(schema: fbs/graphpipe.fbs, GraphPipe's published graphpipe.fbs).",
        "A MetadataRequest answers this metadata as a `MetadataResponse` flatbuffer; an "
        "InferRequest answers an `InferResponse` flatbuffer (application/octet-stream).",
        "InferRequest: one input tensor, `prompt` (String [n]) or `prompt_ids` (Int64 or "
        "Int32 [n, m], rows right-padded with -1); output_names any of `text`, `token_ids`, "
        "`logprobs` (default `text`); config a JSON object such as "
        '{"max_tokens": 32, "temperature": 0, "stop": ["\\n"]}.',
        "Tensor data is little-endian and row-major; strings go in `string_val`.",
        "Errors answer an `InferResponse` whose `errors` holds one Error; its code is the "
        "HTTP status of the response (400 bad request, 401 bad API key, 404 unknown model, "
        "413 over the size limit, 500/503 engine failure, 503 with a Retry-After header: "
        "the server's queue is full or it is shutting down, retry after that many seconds).",
        f"LoRA adapters: POST /graphpipe/<adapter> ({adapters}).",
        "With an API key set, send `Authorization: Bearer <key>`.",
    ]


def _get(request: Request, engine: Engine, model: str | None) -> Response:
    try:
        principal_of(request)
        name, _ = _target(engine, model)
    except SwitchboardError as exc:
        error = {"code": exc.graphpipe_code, "message": exc.message}
        return OrjsonResponse({"errors": [error]}, status_code=exc.http_status)
    body: dict[str, Any] = describe(name, __version__, engine.info).to_json()
    body["how_to_call"] = _how_to_call(request.url.path, engine)
    return OrjsonResponse(body)


_BINARY = {OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}}}
_POST_DOCS: dict[str, Any] = {
    "openapi_extra": {
        "requestBody": {
            "required": True,
            "description": "exactly one GraphPipe `Request` flatbuffer (fbs/graphpipe.fbs)",
            "content": _BINARY,
        }
    },
    "responses": {
        200: {
            "description": "an `InferResponse` or `MetadataResponse` flatbuffer",
            "content": _BINARY,
        },
        "4XX": {
            "description": "an `InferResponse` whose one `Error` has the HTTP status as code",
            "content": _BINARY,
        },
        "5XX": {
            "description": "an `InferResponse` whose one `Error` has the HTTP status as code",
            "content": _BINARY,
        },
    },
}
# GET's own errors are JSON; an error no route handled (a bug, a framework error) is the
# InferResponse every /graphpipe path answers.
_GET_ERRORS = {
    "description": "`GraphPipeErrors` as JSON, or an `InferResponse` flatbuffer",
    "content": {"application/json": {"schema": documented(GraphPipeErrors)}, **_BINARY},
}
_GET_DOCS: dict[str, Any] = {
    "responses": {200: {"model": GraphPipeMetadata}, "4XX": _GET_ERRORS, "5XX": _GET_ERRORS}
}


@router.post("/graphpipe", response_class=Response, **_POST_DOCS)
async def infer(request: Request, engine: EngineDep, settings: SettingsDep) -> Response:
    return await _post(request, engine, settings.graphpipe_max_request_bytes, None)


@router.post("/graphpipe/{model:rest}", response_class=Response, **_POST_DOCS)
async def infer_model(
    request: Request, engine: EngineDep, settings: SettingsDep, model: str
) -> Response:
    return await _post(request, engine, settings.graphpipe_max_request_bytes, model)


@router.get("/graphpipe", response_class=Response, **_GET_DOCS)
async def metadata(request: Request, engine: EngineDep) -> Response:
    return _get(request, engine, None)


@router.get("/graphpipe/{model:rest}", response_class=Response, **_GET_DOCS)
async def metadata_model(request: Request, engine: EngineDep, model: str) -> Response:
    return _get(request, engine, model)
