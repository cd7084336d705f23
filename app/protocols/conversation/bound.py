"""Admission's bound of a chat-shaped call's prompt tokens, known before anything is
templated: one rule for Chat, Responses and Messages. Each API walks its body and tells a
`PromptBound` each piece the prompt will hold; how a piece counts is decided here, so
the three agree with each other and with the prompt that is built
(`app.protocols.conversation.plan`).

What counts is every text the chat template is given, as it is given it:

- `text`: a message's text (system, developer and instructions included), reasoning
  given back, a tool's result, a compaction's summary as the assistant's turn it
  stands for;
- `call`: a tool call the conversation holds, as the template writes it: its name and
  its arguments' JSON text;
- `tool`: a tool's definition as every template is given it, whatever the API's shape:
  OpenAI Chat's `{"type": "function", "function": {name, description, parameters}}`,
  as JSON (`as_json`: what a template's `tojson` writes).

Each counts `text_tokens_bound`, whose allowance covers the template's own tokens around
it. What does not count: images (a data URL's length says nothing of the tokens its
vision encoder makes), ids and the body's own field names. Listing never raises: a body
the translation will refuse is refused then, after admission, as any other. The real
count replaces the bound once the prompt is templated (`Ticket.measured`); a continued
conversation's stored turns are counted then too, since they are read after admission.
"""

from __future__ import annotations

import json
from typing import Any

from app.admission import text_tokens_bound


def as_json(value: object) -> str:
    """A structure as the prompt holds it: as the translations write a call's arguments
    given as an object, and as a template's `tojson` writes a tool (Python's separators,
    non-ASCII escaped)."""
    return json.dumps(value, default=str)


class PromptBound:
    """The bound of one call's prompt tokens, piece by piece (`tokens`)."""

    def __init__(self) -> None:
        self.tokens = 0

    def text(self, text: str | bytes | None) -> None:
        if text:
            self.tokens += text_tokens_bound(text)

    def call(self, name: Any, arguments: Any) -> None:
        self.text(name if isinstance(name, str) else None)
        if arguments is not None:
            self.text(arguments if isinstance(arguments, str) else as_json(arguments))

    def tool(self, name: Any, description: Any, parameters: Any) -> None:
        function = {"name": name, "description": description, "parameters": parameters}
        self.text(as_json({"type": "function", "function": function}))
