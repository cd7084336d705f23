"""OpenAI-compatible HTTP routes: completions, chat, their render routes (llm-d's
tokenization), models, LoRA admin (the control plane's: `app.engine.runtime_lora`),
tokenizer, version; and OpenAI's error answer, which
every route of this API (and the Responses API's) renders its errors with.

Thin adapter: body -> `app.routes.http.calls.serve_call` (admission: one unit per
prompt x choice, before any tokenizing, a refusal a 503 with Retry-After; the exchange built
off the event loop, where validation happens before any stream starts; the engine; JSON
or SSE, errors inside a started stream then `data: [DONE]`). A client that goes away
aborts its engine requests.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel

from app import __version__
from app.admission import Admission, ProtocolName
from app.config import Settings
from app.engine.base import Engine
from app.engine.models import served_by
from app.engine.runtime_lora import RuntimeLora
from app.engine.validation import check_token_ids
from app.errors import SwitchboardError
from app.protocols.bodies import validate
from app.protocols.conversation.plan import template_conversation
from app.protocols.exchange import Exchange
from app.protocols.openai.admission_units import admission_units, tokenizer_units
from app.protocols.openai.chat import ChatExchange, tokenize_conversation
from app.protocols.openai.completions import CompletionExchange
from app.protocols.openai.errors import error_body
from app.protocols.openai.render import render_chat, render_completions
from app.routes.deps import (
    AdmissionDep,
    AuthDep,
    ControlPlaneDep,
    EngineDep,
    SettingsDep,
    principal_on,
)
from app.routes.http.answers import Answers, error_answers, event_stream
from app.routes.http.bodies import json_body, read_body, read_json
from app.routes.http.calls import serve_call
from app.routes.http.errors import api_router, retry_headers
from app.routes.http.json import OrjsonResponse
from app.sessions.calls import admitted_in_prompt_thread
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

E = TypeVar("E")


def openai_error(
    error: SwitchboardError, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """`error` as OpenAI answers it: `{"error": {"message", "type", "param", "code"}}`."""
    return OrjsonResponse(
        error_body(error, status),
        status_code=status or error.http_status,
        headers=retry_headers(error, headers),
    )


router = api_router(openai_error)
v1 = api_router(openai_error, dependencies=[AuthDep])
# The routes that change the server: a control-plane (or full) key's.
control = api_router(openai_error, dependencies=[ControlPlaneDep])

# What /openapi.json says each route answers.
_ERRORS = error_answers(ErrorResponse, "OpenAI error body", "503: the engine is down")


def _answers(model: type[BaseModel], chunk: type[BaseModel] | None = None) -> Answers:
    ok: dict[str, Any] = {"model": model}
    if chunk is not None:
        ok["description"] = (
            f"`{model.__name__}`, or with `stream: true` server-sent events: each "
            f"`data: <{chunk.__name__}>` (an error after the first event comes as "
            "`data: <ErrorResponse>`), ending with `data: [DONE]`"
        )
        ok["content"] = event_stream(chunk, ErrorResponse, named=False, done=True)
    return {200: ok, **_ERRORS}


_PLAIN_ANSWER = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_ERRORS}


def _completion(engine: Engine, body: CompletionRequest) -> Callable[[], CompletionExchange]:
    """How to build a Completions body's exchange (in the prompt thread, by its caller)."""
    args = _exchange_args(engine, "cmpl", body.model)
    return lambda: CompletionExchange(body, engine.info, engine.tokenizer, **args)


def _chat(engine: Engine, body: ChatCompletionRequest) -> Callable[[], ChatExchange]:
    """How to build a Chat body's exchange (in the prompt thread, by its caller)."""
    args = _exchange_args(engine, "chatcmpl", body.model)
    return lambda: ChatExchange(body, engine.info, engine.tokenizer, **args)


def _exchange_args(engine: Engine, prefix: str, model: str | None) -> dict[str, Any]:
    return {
        "response_id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "served": served_by(engine, model),
    }


async def _served(
    request: Request,
    engine: Engine,
    admission: Admission,
    body: CompletionRequest | ChatCompletionRequest,
    build: Callable[[], Exchange],
) -> Response:
    """An OpenAI call answered: admitted (one unit per prompt x choice), built, run."""
    return await serve_call(
        request,
        engine,
        admission,
        protocol=ProtocolName.OPENAI,
        units=admission_units(body),
        priority=body.priority,
        stream=body.stream,
        build=build,
    )


async def _admitted(
    request: Request,
    admission: Admission,
    units: list[int],
    build: Callable[[], E],
    priority: int = 0,
) -> E:
    """Prompt work for no engine request (the render routes, /tokenize, /detokenize),
    admitted as an OpenAI call of `units` would be."""
    return await admitted_in_prompt_thread(
        admission,
        protocol=ProtocolName.OPENAI,
        units=units,
        principal=principal_on(request),
        build=build,
        priority=priority,
    )


@v1.post(
    "/v1/completions",
    openapi_extra=json_body(CompletionRequest),
    responses=_answers(Completion, CompletionChunk),
)
async def completions(request: Request, engine: EngineDep, admission: AdmissionDep) -> Response:
    body = await read_body(request, CompletionRequest)
    return await _served(request, engine, admission, body, _completion(engine, body))


@v1.post(
    "/v1/chat/completions",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=_answers(ChatCompletion, ChatCompletionChunk),
)
async def chat_completions(
    request: Request, engine: EngineDep, admission: AdmissionDep
) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    return await _served(request, engine, admission, body, _chat(engine, body))


@v1.post(
    "/v1/completions/render",
    openapi_extra=json_body(CompletionRequest),
    responses=_answers(RenderedRequests),
)
async def render_completion(
    request: Request, engine: EngineDep, admission: AdmissionDep
) -> Response:
    body = await read_body(request, CompletionRequest)
    build = _completion(engine, body)
    exchange = await _admitted(request, admission, admission_units(body), build, body.priority)
    return OrjsonResponse(render_completions(exchange))


@v1.post(
    "/v1/chat/completions/render",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=_answers(RenderedRequest),
)
async def render_chat_completion(
    request: Request, engine: EngineDep, admission: AdmissionDep
) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    build = _chat(engine, body)
    exchange = await _admitted(request, admission, admission_units(body), build, body.priority)
    return OrjsonResponse(render_chat(exchange))


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


@control.post(
    "/v1/load_lora_adapter",
    openapi_extra=json_body(LoadLoraRequest),
    response_class=PlainTextResponse,
    responses=_PLAIN_ANSWER,
)
async def load_lora_adapter(request: Request, engine: EngineDep, settings: SettingsDep) -> Response:
    body = await read_body(request, LoadLoraRequest)
    path = await asyncio.to_thread(_runtime_lora(settings).path, body.lora_path)
    await engine.load_lora(body.lora_name, path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@control.post(
    "/v1/unload_lora_adapter",
    openapi_extra=json_body(UnloadLoraRequest),
    response_class=PlainTextResponse,
    responses=_PLAIN_ANSWER,
)
async def unload_lora_adapter(
    request: Request, engine: EngineDep, settings: SettingsDep
) -> Response:
    body = await read_body(request, UnloadLoraRequest)
    _runtime_lora(settings).check_on()
    await engine.unload_lora(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _runtime_lora(settings: Settings) -> RuntimeLora:
    return RuntimeLora(settings.lora_root if settings.runtime_lora_updating() else None)


@v1.post(
    "/tokenize",
    openapi_extra=json_body(TokenizeCompletionRequest, TokenizeChatRequest),
    responses=_answers(TokenizeResponse),
)
async def tokenize(request: Request, engine: EngineDep, admission: AdmissionDep) -> dict[str, Any]:
    """Tokenizing is a call's prompt work: admitted as one, in the prompt thread."""
    data = await read_json(request)
    chat = isinstance(data, dict) and "messages" in data
    body = validate(TokenizeChatRequest if chat else TokenizeCompletionRequest, data)
    served_by(engine, body.model)
    tokenizer, info = engine.tokenizer, engine.info

    def build() -> dict[str, Any]:
        if isinstance(body, TokenizeChatRequest):
            conversation = tokenize_conversation(body, info)
            tokens = template_conversation(conversation, info, tokenizer).prompt_token_ids
        else:
            tokens = tokenizer.encode(body.prompt, body.add_special_tokens)
        result: dict[str, Any] = {
            "count": len(tokens),
            "max_model_len": info.max_model_len,
            "tokens": tokens,
        }
        if body.return_token_strs:
            result["token_strs"] = [tokenizer.token_to_str(t) for t in tokens]
        return result

    return await _admitted(request, admission, tokenizer_units(body), build)


@v1.post(
    "/detokenize",
    openapi_extra=json_body(DetokenizeRequest),
    responses=_answers(DetokenizeResponse),
)
async def detokenize(
    request: Request, engine: EngineDep, admission: AdmissionDep
) -> dict[str, Any]:
    body = await read_body(request, DetokenizeRequest)
    served_by(engine, body.model)
    check_token_ids(body.tokens, engine.info, "tokens")
    prompt = await _admitted(
        request, admission, tokenizer_units(body), lambda: engine.tokenizer.decode(body.tokens)
    )
    return {"prompt": prompt}


@router.get("/version", responses=_answers(VersionResponse))
async def version(engine: EngineDep) -> dict[str, str]:
    return {"version": __version__, "engine": engine.info.engine_version}


router.include_router(v1)
router.include_router(control)
