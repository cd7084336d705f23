"""What the store keeps of one response: `StoredResponse`, and its bytes.

A record is self-contained, so a follow-up needs one read whatever the length of the
conversation, and survives its ancestors' expiry or deletion:

- `response`: the response object as `GET /v1/responses/{id}` answers it (status, output
  items, usage, the echoed request fields);
- `input_items`: the items this response was given as `input`, in normal form with their
  ids (`items.read_input`), as `GET /v1/responses/{id}/input_items` lists them;
- `history`: the conversation before that input (the `context()` of the response it
  continued, empty for a first turn). Instructions are not part of it: OpenAI does not
  carry a previous response's `instructions` over.

`context()` is what a response continuing this one starts from. Encoded as JSON (orjson);
`decode` refuses bytes that are not a record (a foreign key in a shared Redis, a
truncated row) as `None`, which the caller treats as not found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from app.protocols.openai.responses.items import Item

FORMAT = 1


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[Item] = field(default_factory=list)
    history: list[Item] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.response["id"])

    @property
    def status(self) -> str:
        return str(self.response["status"])

    def context(self) -> list[Item]:
        return [*self.history, *self.input_items, *(self.response.get("output") or ())]

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT,
                "response": self.response,
                "input_items": self.input_items,
                "history": self.history,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> StoredResponse | None:
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            return None
        response = raw.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("id"), str):
            return None
        return cls(response, list(raw.get("input_items") or ()), list(raw.get("history") or ()))
