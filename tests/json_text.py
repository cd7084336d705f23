"""Reading JSON text as a client receives it, for tests of constrained output."""

from __future__ import annotations


def whitespace_outside_strings(text: str) -> bool:
    """`text` (JSON) holds whitespace between its tokens: what a server that disables
    free whitespace (`disable_any_whitespace`) must never let a model write."""
    inside = escaped = False
    for c in text:
        if inside:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                inside = False
        elif c == '"':
            inside = True
        elif c in " \t\r\n":
            return True
    return False
