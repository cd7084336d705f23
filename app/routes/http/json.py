"""JSON encoding of every HTTP answer and SSE event: orjson (FastAPI's ORJSONResponse is
deprecated in the FastAPI we run, and its JSONResponse uses the slower stdlib json).

`dump_json` never fails on text: orjson refuses strings holding lone surrogates (see
`app.wire_text`), so on that failure, and only then, the content is re-encoded with every
string repaired. The common case pays nothing.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

from app.wire_text import well_formed

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _repaired(content: Any) -> Any:
    if isinstance(content, str):
        return well_formed(content)
    if isinstance(content, dict):
        return {_repaired(k): _repaired(v) for k, v in content.items()}
    if isinstance(content, list | tuple):
        return [_repaired(v) for v in content]
    return content


def dump_json(content: Any) -> bytes:
    try:
        return orjson.dumps(content, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return orjson.dumps(_repaired(content), option=_OPTIONS)


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dump_json(content)
