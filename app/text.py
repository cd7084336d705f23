"""Text every wire format can carry.

A Python `str` may hold lone surrogates (U+D800..U+DFFF without their pair): the stdlib
`json` module decodes a client's `"\\ud800"` escape into one, and so does any
`surrogateescape` decoding. UTF-8 cannot encode them, so orjson, protobuf, flatbuffer
strings and websocket text frames all refuse them, and an error message quoting the
client's input would fail to render. `well_formed` is the one repair: each lone
surrogate becomes U+FFFD (a surrogate pair held as two code points becomes its
character), every other string is returned as is, at the cost of one encode.
"""

from __future__ import annotations


def well_formed(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (`text` itself if it has none)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text
