"""The JSON response class of every route: orjson-encoded (FastAPI's ORJSONResponse is
deprecated in the FastAPI we run, and its JSONResponse uses the slower stdlib json)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
