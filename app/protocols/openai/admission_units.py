"""What an OpenAI Completions or Chat call asks admission for (`app.admission`), before
any tokenizing or templating: one unit per engine request it will make (each prompt x
each of its `n` choices, in the order the exchanges plan them), each with an upper bound
of its prompt tokens: a completion prompt's own, a chat body's by the rule every
chat-shaped API shares (`app.protocols.openai.chat.prompt_bound`). The exchange corrects
the bound once it has tokenized (`Ticket.measured`, through `app.admission.run`). A
Responses call is one unit (`app.sessions.responses`)."""

from __future__ import annotations

from app.admission import text_tokens_bound
from app.protocols.openai.chat import prompt_bound
from schemas.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)


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


def admission_units(body: CompletionRequest | ChatCompletionRequest) -> list[int]:
    chat = isinstance(body, ChatCompletionRequest)
    prompts = [prompt_bound(body)] if chat else _prompt_bounds(body)
    return [bound for bound in prompts for _ in range(body.n)]


def tokenizer_units(
    body: TokenizeCompletionRequest | TokenizeChatRequest | DetokenizeRequest,
) -> list[int]:
    """What /tokenize and /detokenize ask admission for: one unit, bounded as a call's
    prompt of the same body (their tokenizer work is a call's prompt work)."""
    if isinstance(body, DetokenizeRequest):
        return [len(body.tokens)]
    if isinstance(body, TokenizeChatRequest):
        return [prompt_bound(body)]
    return [text_tokens_bound(body.prompt)]
