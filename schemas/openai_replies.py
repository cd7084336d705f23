"""OpenAI response bodies as pydantic models: what /openapi.json documents for the
OpenAI-compatible routes.

Documentation only: the cores in `app.protocols.openai` build their answers as dicts and
the routes encode them with orjson (no model on the hot path). The models describe those
dicts; the unit and schemathesis tests hold the two together. Objects stay open (extra
keys allowed), as OpenAI's own are, so that an added field is not a breaking change.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, RootModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(BaseModel):
    """Every error of the OpenAI routes (and of any path outside /graphpipe)."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class _Envelope(BaseModel):
    id: str
    created: int
    model: str


class Completion(_Envelope):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(_Envelope):
    """One `data:` event of a streamed completion (the stream ends with `data: [DONE]`)."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletion(_Envelope):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletionChunk(_Envelope):
    """One `data:` event of a streamed chat completion (ends with `data: [DONE]`)."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(
        default=None, description="present when return_token_strs is true"
    )


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
    engine: str


class RenderedRequest(BaseModel):
    """What /v1/*/render answers: the request as the engine would get it (vLLM's
    `GenerateRequest` shape), tokenized and validated, never run."""

    request_id: str
    token_ids: list[int]
    token_offsets: None = None
    features: None = None
    content_parts: None = None
    sampling_params: dict[str, object]
    model: str
    reasoning_ended: None = None
    reasoning_parser_kwargs: None = None
    return_token_ids: None = None
    output_mode: Literal["tokens"] = "tokens"
    stream: bool
    stream_options: dict[str, object] | None = None
    cache_salt: str | None = None
    priority: int
    kv_transfer_params: None = None
    ec_transfer_params: None = None


class RenderedRequests(RootModel[list[RenderedRequest]]):
    """/v1/completions/render: one rendered request per prompt."""
