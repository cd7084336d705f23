"""OpenAI-compatible HTTP routes: completions, chat, their render routes (llm-d's
tokenization), models, LoRA admin, tokenizer, health.

Thin adapter: body -> admission (one unit per prompt x choice, before any tokenizing; a
refusal is a 503 with Retry-After) -> core (validation happens there, before any stream
starts) -> engine -> core -> JSON or SSE. Once a stream has started, errors go inside it
(an SSE error event, then `data: [DONE]`). A client that goes away aborts its engine
requests (`unless_disconnected`, under streams too).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel

from app import __version__
from app.admission import Admission, Tickets
from app.engine.base import Engine
from app.engine.validation import check_token_ids
from app.errors import InternalError, ModelNotFound, SwitchboardError
from app.protocols.openai.chat import ChatCore
from app.protocols.openai.completions import CompletionCore
from app.protocols.openai.render import render_chat, render_completions
from app.protocols.openai.units import admission_units
from app.routes.deps import AdmissionDep, AuthDep, EngineDep
from app.routes.http.bodies import documented, json_body, parse_json, read_body, validate
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.generations import merge_generations
from app.routes.http.json import OrjsonResponse
from app.routes.http.sse import DONE, EventStream, sse
from schemas.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoraRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    UnloadLoraRequest,
)
from schemas.openai_replies import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    DetokenizeResponse,
    ErrorResponse,
    ModelList,
    RenderedRequest,
    RenderedRequests,
    TokenizeResponse,
    VersionResponse,
)

router = APIRouter()
v1 = APIRouter(dependencies=[AuthDep])

Core = CompletionCore | ChatCore

# What /openapi.json says each route answers (documentation only: the handlers return
# ready Responses, never validated through these models).
_ERROR_BODY = {"application/json": {"schema": documented(ErrorResponse)}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"description": "OpenAI error body", "content": _ERROR_BODY},
    "5XX": {"description": "OpenAI error body (503: the engine is down)", "content": _ERROR_BODY},
}


def _answers(model: type[BaseModel], chunk: type[BaseModel] | None = None) -> dict[int | str, Any]:
    ok: dict[str, Any] = {"model": model}
    if chunk is not None:
        ok["description"] = (
            f"`{model.__name__}`, or with `stream: true` server-sent events: each "
            f"`data: <{chunk.__name__}>` (an error after the first event comes as "
            "`data: <ErrorResponse>`), ending with `data: [DONE]`"
        )
        event = {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "string",
                    "anyOf": [
                        {"const": "[DONE]"},
                        {
                            "contentMediaType": "application/json",
                            "contentSchema": documented(chunk, ErrorResponse),
                        },
                    ],
                }
            },
        }
        ok["content"] = {"text/event-stream": {"itemSchema": event}}
    return {200: ok, **_ERRORS}


_PLAIN_ANSWER = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_ERRORS}


def _model(engine: Engine, requested: str | None) -> str:
    name = requested or engine.info.model_name
    if not engine.has_model(name):
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
    return name


async def _stream(engine: Engine, core: Core, tickets: Tickets) -> AsyncGenerator[bytes, None]:
    try:
        requests = [p.request for p in core.plans]
        async for index, event in merge_generations(engine, requests, tickets):
            for chunk in core.chunks(index, event):
                yield sse(chunk)
        usage = core.usage_chunk()
        if usage is not None:
            yield sse(usage)
    except SwitchboardError as exc:
        yield sse(exc.openai_body())
    except Exception as exc:  # a bug must still end the stream in OpenAI's shape
        yield sse(InternalError.wrap(exc).openai_body())
    yield DONE


async def _collect(engine: Engine, core: Core, tickets: Tickets) -> dict[str, Any]:
    requests = [p.request for p in core.plans]
    async for index, event in merge_generations(engine, requests, tickets):
        core.feed(index, event)
    return core.response()


async def _serve(
    request: Request, engine: Engine, core: Core, stream: bool, tickets: Tickets
) -> Response:
    if stream:
        return EventStream(_stream(engine, core, tickets), tickets)
    try:
        with tickets:
            body = await unless_disconnected(request.receive, _collect(engine, core, tickets))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    except SwitchboardError:
        raise
    except Exception as exc:  # a bug: the client gets its id, never its text
        raise InternalError.wrap(exc) from exc
    return OrjsonResponse(body)


async def _admitted(
    request: Request,
    engine: Engine,
    admission: Admission,
    body: CompletionRequest | ChatCompletionRequest,
    make_core: Callable[[], Core],
) -> Response:
    """Admit the call (every prompt x choice, before any tokenizing), build its core (the
    places go back if that fails: a bad request holds none) and serve it."""
    tickets = admission.admit_all("openai", admission_units(body), priority=body.priority)
    try:
        core = make_core()
    except BaseException:
        tickets.release()
        raise
    return await _serve(request, engine, core, body.stream, tickets)


def _core_args(engine: Engine, prefix: str, model: str | None) -> dict[str, Any]:
    return {
        "response_id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": _model(engine, model),
    }


@v1.post(
    "/v1/completions",
    openapi_extra=json_body(CompletionRequest),
    responses=_answers(Completion, CompletionChunk),
)
async def completions(request: Request, engine: EngineDep, admission: AdmissionDep) -> Response:
    body = await read_body(request, CompletionRequest)
    return await _admitted(
        request,
        engine,
        admission,
        body,
        lambda: CompletionCore(
            body, engine.info, engine.tokenizer, **_core_args(engine, "cmpl", body.model)
        ),
    )


@v1.post(
    "/v1/chat/completions",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=_answers(ChatCompletion, ChatCompletionChunk),
)
async def chat_completions(
    request: Request, engine: EngineDep, admission: AdmissionDep
) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    return await _admitted(
        request,
        engine,
        admission,
        body,
        lambda: ChatCore(
            body, engine.info, engine.tokenizer, **_core_args(engine, "chatcmpl", body.model)
        ),
    )


@v1.post(
    "/v1/completions/render",
    openapi_extra=json_body(CompletionRequest),
    responses=_answers(RenderedRequests),
)
async def render_completion(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, CompletionRequest)
    core = CompletionCore(
        body, engine.info, engine.tokenizer, **_core_args(engine, "cmpl", body.model)
    )
    return OrjsonResponse(render_completions(core))


@v1.post(
    "/v1/chat/completions/render",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=_answers(RenderedRequest),
)
async def render_chat_completion(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    core = ChatCore(
        body, engine.info, engine.tokenizer, **_core_args(engine, "chatcmpl", body.model)
    )
    return OrjsonResponse(render_chat(core))


@v1.get("/v1/models", responses=_answers(ModelList))
async def models(engine: EngineDep) -> dict[str, Any]:
    info = engine.info
    created = int(time.time())

    def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "switchboard",
            "root": root,
            "parent": parent,
            "max_model_len": info.max_model_len,
        }

    data = [card(info.model_name, info.model_path, None)]
    data += [card(a.name, a.path, info.model_name) for a in engine.loras()]
    return {"object": "list", "data": data}


@v1.post(
    "/v1/load_lora_adapter",
    openapi_extra=json_body(LoadLoraRequest),
    response_class=PlainTextResponse,
    responses=_PLAIN_ANSWER,
)
async def load_lora_adapter(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, LoadLoraRequest)
    await engine.load_lora(body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@v1.post(
    "/v1/unload_lora_adapter",
    openapi_extra=json_body(UnloadLoraRequest),
    response_class=PlainTextResponse,
    responses=_PLAIN_ANSWER,
)
async def unload_lora_adapter(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, UnloadLoraRequest)
    await engine.unload_lora(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


@v1.post(
    "/tokenize",
    openapi_extra=json_body(TokenizeCompletionRequest, TokenizeChatRequest),
    responses=_answers(TokenizeResponse),
)
async def tokenize(request: Request, engine: EngineDep) -> dict[str, Any]:
    data = parse_json(await request.body())
    chat = isinstance(data, dict) and "messages" in data
    body = validate(TokenizeChatRequest if chat else TokenizeCompletionRequest, data)
    _model(engine, body.model)
    tokenizer = engine.tokenizer
    if isinstance(body, TokenizeChatRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        tokens = tokenizer.apply_chat_template(messages, body.add_generation_prompt)
    else:
        tokens = tokenizer.encode(body.prompt, body.add_special_tokens)
    result: dict[str, Any] = {
        "count": len(tokens),
        "max_model_len": engine.info.max_model_len,
        "tokens": tokens,
    }
    if body.return_token_strs:
        result["token_strs"] = [tokenizer.token_to_str(t) for t in tokens]
    return result


@v1.post(
    "/detokenize",
    openapi_extra=json_body(DetokenizeRequest),
    responses=_answers(DetokenizeResponse),
)
async def detokenize(request: Request, engine: EngineDep) -> dict[str, Any]:
    body = await read_body(request, DetokenizeRequest)
    _model(engine, body.model)
    check_token_ids(body.tokens, engine.info, "tokens")
    return {"prompt": engine.tokenizer.decode(body.tokens)}


@router.get("/version", responses=_answers(VersionResponse))
async def version(engine: EngineDep) -> dict[str, str]:
    return {"version": __version__, "engine": engine.info.engine_version}


router.include_router(v1)
