"""The access log: one line per request once it has ended, on the `switchboard.access`
logger (`--access-log text`, the default; `json` for one JSON object a line; `off`).

Its fields: the time it ended, the request id, tenant, API, model, what was called
(method and path, or the RPC), the HTTP status (0: not HTTP), the outcome
(`app.telemetry.record.OUTCOMES`) and the error's type, input, output and cached tokens,
the time to the first token and the whole duration (seconds), and the client's address.
Never a prompt, an output or a key: no body is read here, and a path is written without
its query string (a browser's websocket may carry its key there, `?token=`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from app.telemetry.record import RequestRecord

LOGGER = "switchboard.access"
FORMATS = ("text", "json", "off")
logger = logging.getLogger(LOGGER)


def fields(record: RequestRecord, model: str | None) -> dict[str, Any]:
    ttft = record.ttft_s
    error = record.error
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "request_id": record.request_id,
        "tenant": record.tenant,
        "api": record.api,
        "model": model,
        "call": record.name,
        "status": record.status,
        "outcome": record.outcome,
        "error": type(error).__name__ if error is not None else None,
        "input_tokens": record.input_tokens,
        "output_tokens": record.output_tokens,
        "cached_tokens": record.cached_tokens,
        "ttft_s": None if ttft is None else round(ttft, 6),
        "duration_s": round(record.duration_s, 6),
        "client": record.client,
    }


class AccessLog:
    def __init__(self, form: str) -> None:
        self._form = form

    def write(self, record: RequestRecord, model: str | None) -> None:
        if self._form == "off" or not logger.isEnabledFor(logging.INFO):
            return
        line = fields(record, model)
        if self._form == "json":
            logger.info(orjson.dumps(line).decode())
            return
        logger.info(
            '%s "%s" %s %s',
            line["client"] or "-",
            line["call"],
            line["status"],
            " ".join(f"{k}={_text(v)}" for k, v in line.items() if k not in _IN_FRONT),
        )


_IN_FRONT = ("client", "call", "status", "time")


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
