"""OpenAI-compatible HTTP routes: completions, chat, their render routes (llm-d's
tokenization), models, LoRA admin, tokenizer, health.

Thin adapter: body -> core (validation happens there, before any stream starts) -> engine
-> core -> JSON or SSE. Once a stream has started, errors go inside it (an SSE error
event, then `data: [DONE]`). A client that goes away aborts its engine requests: streams
are cancelled by sse-starlette, non-streamed calls by `unless_disconnected`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from sse_starlette import EventSourceResponse

from app import __version__
from app.engine.base import Engine
from app.errors import EngineError, InvalidRequest, ModelNotFound, SwitchboardError
from app.protocols.openai.chat import ChatCore
from app.protocols.openai.completions import CompletionCore
from app.protocols.openai.render import render_chat, render_completions
from app.routes.bodies import parse_json, read_body, validate
from app.routes.deps import AuthDep, EngineDep
from app.routes.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.fanout import merge_generations
from app.routes.responses import OrjsonResponse
from schemas.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoraRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    UnloadLoraRequest,
)

logger = logging.getLogger(__name__)
router = APIRouter()
v1 = APIRouter(dependencies=[AuthDep])

Core = CompletionCore | ChatCore
_DONE = b"data: [DONE]\n\n"


def _model(engine: Engine, requested: str | None) -> str:
    name = requested or engine.info.model_name
    if not engine.has_model(name):
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
    return name


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def _stream(engine: Engine, core: Core) -> AsyncIterator[bytes]:
    try:
        async for index, event in merge_generations(engine, [p.request for p in core.plans]):
            for chunk in core.chunks(index, event):
                yield _sse(chunk)
        usage = core.usage_chunk()
        if usage is not None:
            yield _sse(usage)
    except SwitchboardError as exc:
        yield _sse(exc.openai_body())
    except Exception as exc:  # a bug must still end the stream in OpenAI's shape
        logger.exception("stream %s failed", core.response_id)
        yield _sse(EngineError(f"Internal error: {exc!r}").openai_body())
    yield _DONE


async def _collect(engine: Engine, core: Core) -> dict[str, Any]:
    async for index, event in merge_generations(engine, [p.request for p in core.plans]):
        core.feed(index, event)
    return core.response()


async def _serve(request: Request, engine: Engine, core: Core, stream: bool) -> Response:
    if stream:
        sse: Response = EventSourceResponse(_stream(engine, core), ping=None)
        return sse
    try:
        body = await unless_disconnected(request, _collect(engine, core))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    return OrjsonResponse(body)


def _core_args(engine: Engine, prefix: str, model: str | None) -> dict[str, Any]:
    return {
        "response_id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": _model(engine, model),
    }


@v1.post("/v1/completions")
async def completions(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, CompletionRequest)
    core = CompletionCore(
        body, engine.info, engine.tokenizer, **_core_args(engine, "cmpl", body.model)
    )
    return await _serve(request, engine, core, body.stream)


@v1.post("/v1/chat/completions")
async def chat_completions(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    core = ChatCore(
        body, engine.info, engine.tokenizer, **_core_args(engine, "chatcmpl", body.model)
    )
    return await _serve(request, engine, core, body.stream)


@v1.post("/v1/completions/render")
async def render_completion(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, CompletionRequest)
    core = CompletionCore(
        body, engine.info, engine.tokenizer, **_core_args(engine, "cmpl", body.model)
    )
    return OrjsonResponse(render_completions(core))


@v1.post("/v1/chat/completions/render")
async def render_chat_completion(request: Request, engine: EngineDep) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    core = ChatCore(
        body, engine.info, engine.tokenizer, **_core_args(engine, "chatcmpl", body.model)
    )
    return OrjsonResponse(render_chat(core))


@v1.get("/v1/models")
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


@v1.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraRequest, engine: EngineDep) -> Response:
    await engine.load_lora(body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@v1.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraRequest, engine: EngineDep) -> Response:
    await engine.unload_lora(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


@v1.post("/tokenize")
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


@v1.post("/detokenize")
async def detokenize(body: DetokenizeRequest, engine: EngineDep) -> dict[str, Any]:
    _model(engine, body.model)
    if any(t >= engine.info.vocab_size for t in body.tokens):
        raise InvalidRequest(f"Token ids must be in [0, {engine.info.vocab_size})", param="tokens")
    return {"prompt": engine.tokenizer.decode(body.tokens)}


@router.get("/health")
async def health(engine: EngineDep) -> Response:
    await engine.check_health()
    return Response(status_code=200)


@router.get("/version")
async def version(engine: EngineDep) -> dict[str, str]:
    return {"version": __version__, "engine": engine.info.engine_version}


router.include_router(v1)
