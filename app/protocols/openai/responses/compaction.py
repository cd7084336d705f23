"""POST /v1/responses/compact, sans-IO: a conversation made short enough to go on with.

A compaction is a Responses call the server makes itself (`summary_call`): the
conversation to compact (the stored context of `previous_response_id`, then `input`),
the body's `instructions`, and last a user message asking the model for a summary; not
stored, and with `truncation: "auto"`, so that a conversation too long for the context
loses its oldest turns rather than failing (the request for a summary is never dropped).
Its answer is the compacted window (`compacted`): the conversation's user messages as they
were, then one `compaction` item that carries the summary and stands for everything else
(assistant turns, tool calls and their outputs, reasoning). A client starts a new chain
with that window as `input` (no `previous_response_id`); the summary reads to the model as
the assistant's turn it stands for (`items.messages`).

The summary is the model's own words, written to the end of the context at most (a model
that never ends its turns writes that far) or to `max_output_tokens` (an extra of this
server's: OpenAI's compact takes no bound); a summary cut there still makes a compaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.protocols.openai.responses.events import Body
from app.protocols.openai.responses.items import Item, compaction_item, new_id
from schemas.openai_responses import CompactRequest, ResponsesRequest

SUMMARY_REQUEST = (
    "Write a summary of the conversation so far, for whoever continues it without having "
    "seen it: what was asked, what was done and decided, what was found, and what is left "
    "to do. Keep every name, number and detail that may be needed later."
)


def summary_call(body: CompactRequest) -> ResponsesRequest:
    """The Responses call that writes the summary of `body`'s conversation."""
    given = (
        [{"type": "message", "role": "user", "content": body.input}]
        if isinstance(body.input, str)
        else list(body.input or ())
    )
    return ResponsesRequest.model_validate(
        {
            "model": body.model,
            "input": [*given, {"type": "message", "role": "user", "content": SUMMARY_REQUEST}],
            "previous_response_id": body.previous_response_id,
            "instructions": body.instructions,
            "prompt_cache_key": body.prompt_cache_key,
            "max_output_tokens": body.max_output_tokens,
            "truncation": "auto",
            "store": False,
        }
    )


def compacted(conversation: Sequence[Item], answer: Body, *, created_at: int) -> Body:
    """The compacted window of `conversation` (the stored context and the input, in normal
    form: the summary request not among them), from the summary call's `answer`."""
    summary = "".join(
        part.get("text") or ""
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    kept = [item for item in conversation if item["type"] == "message" and item["role"] == "user"]
    return {
        "id": new_id("resp_compact"),
        "object": "response.compaction",
        "created_at": created_at,
        "output": [*kept, compaction_item(summary)],
        "usage": answer["usage"],
    }
