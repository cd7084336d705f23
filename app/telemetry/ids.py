"""Request ids: the client's `x-request-id` when it is one, else a fresh one.

A client's id is taken when it is 1 to 128 visible ASCII characters (SMG's rule: nothing
a log line, a header or a JSON string could be broken with); anything else, or none, is
replaced by a minted id (32 hex digits). The id is answered on every answer, is in every
log line written while the request is served (`app.telemetry.logs`), on its span and its
access-log line, and is the prefix of each of its engine requests' ids
(`RequestRecord.for_engine`), so that vLLM's own log lines of it (its internal id adds a
suffix) are found by the same id.
"""

from __future__ import annotations

import re
import secrets

REQUEST_ID_HEADER = "x-request-id"
_RAW_HEADER = REQUEST_ID_HEADER.encode()
_WELL_FORMED = re.compile(rb"[\x21-\x7e]{1,128}")


def take_or_mint(offered: bytes | str | None) -> str:
    """`offered` if it is a well-formed id, else a new one."""
    if offered:
        raw = offered.encode("utf-8", "replace") if isinstance(offered, str) else offered
        if _WELL_FORMED.fullmatch(raw):
            return raw.decode("ascii")
    return secrets.token_hex(16)


def from_headers(headers: list[tuple[bytes, bytes]]) -> str:
    """The request id of an ASGI request's raw headers."""
    for name, value in headers:
        if name == _RAW_HEADER:
            return take_or_mint(value)
    return take_or_mint(None)
