"""The request id in every log line written while a request is served.

The transport's edge sets `REQUEST_ID` for the request (HTTP, a websocket's calls, a gRPC
call); it is a context variable, so every task the request starts carries it, and
`RequestIdFilter`, on the process's log handler, writes it into each record
(`%(request_id)s` in the format; `-` outside any request). vLLM's engine lines name its
own request ids instead, which begin with the request id (`app.telemetry.ids`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


@contextmanager
def logging_as(request_id: str) -> Iterator[None]:
    """Log lines written inside name `request_id` (a call on a connection: its own id)."""
    token = REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        REQUEST_ID.reset(token)


def configure(level: str, access_log: str) -> None:
    """The process's logging (`switchboard serve`): every line with its request id, and
    the access log on a handler of its own (`app.telemetry.access_log`), at INFO
    whatever the level, its JSON lines bare (one object a line, for a log shipper)."""
    logging.basicConfig(level=level.upper(), format=FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
    from app.telemetry.access_log import LOGGER

    access = logging.getLogger(LOGGER)
    access.propagate = False
    if access_log == "off":
        access.disabled = True
        return
    access.setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(message)s" if access_log == "json" else "%(asctime)s %(message)s")
    )
    access.addHandler(handler)
