"""What an OpenAI call asks admission for (`app.admission`), before any tokenizing or
templating: one unit per engine request it will make (each prompt x each of its `n`
choices, in the order the exchanges plan them; one for a response), each with an upper bound
of its prompt tokens: a completion prompt's own, a chat-shaped body's by the rule every
chat-shaped API shares (`app.protocols.conversation.bound`). The exchange corrects the bound
once it has tokenized (`Ticket.measured`, through `app.admission.run`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.admission import text_tokens_bound
from app.protocols.conversation.bound import as_json, prompt_bound
from schemas.openai import ChatCompletionRequest, CompletionRequest
from schemas.openai_responses import ResponsesRequest


def _prompt_bounds(body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [text_tokens_bound(prompt)]
    if prompt and isinstance(prompt[0], int):
        # One token-id prompt: the body's validation made the list all of one kind, so
        # its first item tells (a scan of every id cost ~6 us per call).
        return [len(prompt)]
    # A batch of prompts (a malformed mix is refused by the exchange, after admission).
    return [
        text_tokens_bound(p) if isinstance(p, str) else len(p) if isinstance(p, list) else 1
        for p in prompt
    ]


def _chat_texts(body: ChatCompletionRequest) -> Iterator[str | bytes]:
    for message in body.messages:
        yield message.text()
        if message.reasoning:
            yield message.reasoning
        for call in message.tool_calls or ():
            yield as_json(call)
    for tool in body.tools or ():
        yield as_json(tool)


def _item_texts(item: Any) -> Iterator[str]:
    """A Responses input item's texts, whatever its kind (checked later, when planned)."""
    if not isinstance(item, dict):
        return
    for key in ("content", "output"):  # a message's, a call output's
        value = item.get(key)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]
    for key in ("name", "arguments"):  # a call's
        value = item.get(key)
        if isinstance(value, str):
            yield value


def _responses_texts(body: ResponsesRequest) -> Iterator[str | bytes]:
    if body.instructions:
        yield body.instructions
    if isinstance(body.input, str):
        yield body.input
    else:
        for item in body.input or ():
            yield from _item_texts(item)
    for tool in body.tools or ():
        yield as_json(tool)


def admission_units(
    body: CompletionRequest | ChatCompletionRequest | ResponsesRequest,
) -> list[int]:
    if isinstance(body, ResponsesRequest):
        return [prompt_bound(_responses_texts(body))]
    if isinstance(body, CompletionRequest):
        prompts = _prompt_bounds(body)
    else:
        prompts = [prompt_bound(_chat_texts(body))]
    return [bound for bound in prompts for _ in range(body.n)]
