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


def text(record: RequestRecord, model: str | None) -> str:
    """The text form's line: `fields` but the time (the handler's format writes it),
    written out at once rather than through the dict (with `_write`'s record: a line
    cost 16-18 us through `logger.info` and the dict, 10 this way, measured alone, the
    handler's formatting and write included)."""
    ttft = record.ttft_s
    error = record.error
    return (
        f'{record.client or "-"} "{record.name}" {record.status} '
        f"request_id={record.request_id} tenant={_text(record.tenant)} "
        f"api={_text(record.api)} model={_text(model)} outcome={record.outcome} "
        f"error={type(error).__name__ if error is not None else '-'} "
        f"input_tokens={record.input_tokens} output_tokens={record.output_tokens} "
        f"cached_tokens={record.cached_tokens} "
        f"ttft_s={'-' if ttft is None else round(ttft, 6)} "
        f"duration_s={round(record.duration_s, 6)}"
    )


class AccessLog:
    def __init__(self, form: str) -> None:
        self._form = form

    def write(self, record: RequestRecord, model: str | None) -> None:
        if self._form == "off" or not logger.isEnabledFor(logging.INFO):
            return
        if self._form == "json":
            _write(orjson.dumps(fields(record, model)).decode())
        else:
            _write(text(record, model))


def _write(line: str) -> None:
    # The record made here rather than by `logger.info`, which walks the stack for the
    # caller's file and line: no access-log format shows them.
    logger.handle(logger.makeRecord(LOGGER, logging.INFO, "", 0, line, (), None))


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
