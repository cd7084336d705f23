"""Text every wire format can carry.

A Python `str` may hold lone surrogates (U+D800..U+DFFF without their pair): the stdlib
`json` module decodes a client's `"\\ud800"` escape into one, and so does any
`surrogateescape` decoding. UTF-8 cannot encode them, so orjson, protobuf, flatbuffer
strings and websocket text frames all refuse them, and an error message quoting the
client's input would fail to render. `well_formed` is the one repair: each lone
surrogate becomes U+FFFD (a surrogate pair held as two code points becomes its
character), every other string is returned as is, at the cost of one encode.

`load_json` reads a client's JSON text: the stdlib parser recurses once per level of
nesting, and a few hundred levels (a 10 KB body of `[[[[...`) exhaust the stack left
below the ASGI middlewares, a `RecursionError` that would surface as our own 500; too
deep a document is a `ValueError` like any other text that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any


def load_json(text: str | bytes) -> Any:
    """`json.loads(text)`; ValueError for text that is not JSON, too deep nesting included."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def well_formed(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (`text` itself if it has none)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text
