"""Reading the openai SDK's Responses items in the tests: the SDK types an item as a union
of some thirty kinds, and a test knows which kind it reads (a message, whose first part
holds its text)."""

from __future__ import annotations


def text_of(item: object) -> str:
    """The text of a message item's first content part (input or output)."""
    content = getattr(item, "content", None)
    assert content, f"not a message with content: {item!r}"
    text = getattr(content[0], "text", None)
    assert isinstance(text, str), f"its first part holds no text: {item!r}"
    return text


def role_of(item: object) -> str:
    role = getattr(item, "role", None)
    assert isinstance(role, str), f"not a message: {item!r}"
    return role
