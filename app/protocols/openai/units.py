"""What an OpenAI call asks admission for (`app.admission`), before any tokenizing or
templating: one unit per engine request it will make (each prompt x each of its `n`
choices, in the order the cores plan them), each with an upper bound of its prompt
tokens. The core corrects the bound once it has tokenized (`Ticket.measured`, through
`app.admission.generate`)."""

from __future__ import annotations

from app.admission import text_tokens_bound
from schemas.openai import ChatCompletionRequest, CompletionRequest


def _prompt_bounds(body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [text_tokens_bound(prompt)]
    if prompt and isinstance(prompt[0], int):
        # One token-id prompt: the body's validation made the list all of one kind, so
        # its first item tells (a scan of every id cost ~6 us per call).
        return [len(prompt)]
    # A batch of prompts (a malformed mix is refused by the core, after admission).
    return [
        text_tokens_bound(p) if isinstance(p, str) else len(p) if isinstance(p, list) else 1
        for p in prompt
    ]


def admission_units(body: CompletionRequest | ChatCompletionRequest) -> list[int]:
    if isinstance(body, CompletionRequest):
        prompts = _prompt_bounds(body)
    else:
        # The chat template adds a few tokens per message: the allowance of each message's
        # `text_tokens_bound` covers them.
        prompts = [sum(text_tokens_bound(m.text()) for m in body.messages)]
    return [bound for bound in prompts for _ in range(body.n)]
