"""Admission's bound of a chat-shaped call's prompt tokens, known before anything is
rendered: one rule for Chat, Responses and Messages. Each API lists its body's texts;
`prompt_bound` counts them.

What counts is every text the chat template may write: the messages' texts (system,
developer and instructions included), reasoning given back, each tool call (its name and
arguments), each tool result, each tool's definition as JSON; each with
`text_tokens_bound`'s allowance, which covers the template's own tokens around it. What
does not: images (a data URL's length says nothing of the tokens its vision encoder
makes), ids and the body's own field names. The real count replaces the bound once the
prompt is rendered (`Ticket.measured`); a continued conversation's stored turns are
counted then too, since they are read after admission.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from app.admission import text_tokens_bound


def prompt_bound(texts: Iterable[str | bytes]) -> int:
    return sum(text_tokens_bound(text) for text in texts)


def as_json(value: object) -> bytes:
    """What the template writes of a structure (a tool's definition, a call): its JSON."""
    return orjson.dumps(value)
