"""An ASGI app served by uvicorn on a free port of 127.0.0.1, in a thread of the test's
own process (so a test can patch what the server runs), stopped when the block ends:
with uvicorn's `Config` options (`uvicorn_in_thread`), or as `switchboard serve` serves
it (`served_as_switchboard`: `app.cli.uvicorn_config`)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.types import ASGIApp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def uvicorn_in_thread(app: ASGIApp, **options: Any) -> Iterator[int]:
    """The port `app` is served on (uvicorn's `Config` takes `options`)."""
    import uvicorn

    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", **options)
    with _serving(uvicorn.Server(config)):
        yield port


@contextmanager
def served_as_switchboard(engine: Any, **settings: Any) -> Iterator[int]:
    """The port of `create_app(Settings(model="fake", **settings), engine)`, served by the
    uvicorn configuration `switchboard serve` runs."""
    import uvicorn

    from app.cli import uvicorn_config
    from app.config import Settings
    from app.main import create_app

    options = Settings(model="fake", port=_free_port(), log_level="critical", **settings)
    with _serving(uvicorn.Server(uvicorn_config(create_app(options, engine=engine), options))):
        yield options.port


@contextmanager
def _serving(server: Any) -> Iterator[None]:
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)
