"""OpenAI request bodies as pydantic models: the wire contract of /v1/completions,
/v1/chat/completions, the LoRA admin routes and /tokenize, /detokenize.

Fields follow the OpenAI API plus the extensions `vllm serve` accepts (top_k, min_p,
repetition_penalty, ignore_eos, min_tokens, stop_token_ids, priority, ...), so clients of
either work unchanged. Unknown fields are ignored, as vLLM does. Types are checked here;
the sampling limits (ranges, context length, vocabulary) are the ones every protocol
shares, in `app.engine.validation`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class VllmSampling(_Body):
    """The sampling fields of every OpenAI API served here (completions, chat, responses):
    OpenAI's and the extras `vllm serve` takes."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    priority: int = 0
    logit_bias: dict[str, float] | None = None


class SamplingFields(VllmSampling):
    """Parameters shared by completions and chat."""

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    best_of: int | None = None
    # Structured outputs: OpenAI's field, and vLLM's extra (json, regex, choice,
    # grammar, json_object); shapes are checked in app.protocols.openai.structured.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageUrl(_Body):
    url: str  # inline only: data:<mime>;base64,<data>
    detail: str | None = None


class ImageUrlPart(_Body):
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn's answer to one of them
    reasoning: str | None = None  # an assistant turn's reasoning, given back (vLLM's)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None  # vLLM's: refused unless the server trusts it
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class LoadLoraRequest(_Body):
    lora_name: Annotated[str, Field(min_length=1)]
    lora_path: Annotated[str, Field(min_length=1)]


class UnloadLoraRequest(_Body):
    lora_name: Annotated[str, Field(min_length=1)]


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None  # vLLM's: refused unless the server trusts it
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]
