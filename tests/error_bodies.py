"""The JSON body of an SDK's API error as a dict: the openai and anthropic SDKs type it
`object` (whatever JSON the server sent), and the tests read its fields."""

from __future__ import annotations

from typing import Any

import anthropic
import openai


def body_of(error: openai.APIStatusError | anthropic.APIStatusError) -> dict[str, Any]:
    body = error.body
    assert isinstance(body, dict), f"not a JSON object: {body!r}"
    return body
