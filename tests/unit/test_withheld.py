"""Errors without internals: a store that cannot be reached and a LoRA adapter that cannot
be loaded tell the client a plain message and an error id, never a file path, a host or a
library's words; the server's log holds those under the same id (one mechanism:
`SwitchboardError.withholding`). Over the stores themselves, vLLM's own PEFT reader, and
an app on the fake engine for the answer a client sees."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from app.config import Settings
from app.engine.vllm.lora import check_adapter
from app.errors import InvalidRequest, SwitchboardError, Unavailable
from app.main import create_app
from app.store.redis import RedisStore
from app.store.sqlite import SqliteStore
from app.tenants import DEFAULT_TENANT
from tests.conftest import free_port
from tests.fake_engine import FakeEngine

ERROR_ID = re.compile(r"\(error id ([0-9a-f]{16})\)$")


def logged_under(caplog: pytest.LogCaptureFixture, error: SwitchboardError) -> str:
    """The log line of `error`'s id (with its traceback, if it has one)."""
    match = ERROR_ID.search(error.message)
    assert match is not None and match.group(1) == error.error_id, error.message
    lines = [r for r in caplog.records if match.group(1) in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    record = lines[0]
    return record.getMessage() + (caplog.text if record.exc_info else "")


async def test_a_sqlite_store_that_cannot_be_reached_withholds_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = SqliteStore(blocker / "responses.sqlite3", ttl_s=60, max_bytes=1000)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(Unavailable) as down:
            await store.put(DEFAULT_TENANT, "x", b"y")
    finally:
        await store.close()
    message = down.value.message
    assert message.startswith("The response store is unavailable (error id ")
    assert str(tmp_path) not in message and "sqlite" not in message.lower()
    assert str(blocker) in logged_under(caplog, down.value)


async def test_a_redis_store_that_cannot_be_reached_withholds_its_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    store = RedisStore(f"redis://127.0.0.1:{port}/0", ttl_s=60, max_bytes=1000)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(Unavailable) as down:
            await store.get(DEFAULT_TENANT, "x")
    finally:
        await store.close()
    message = down.value.message
    assert "127.0.0.1" not in message and str(port) not in message
    assert "Connect" not in message and "Errno" not in message  # the library's words
    assert f"127.0.0.1:{port}" in logged_under(caplog, down.value)


async def test_a_client_sees_the_plain_message_and_the_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings = Settings(model="fake", responses_store=str(blocker / "r.sqlite3"))
    app = create_app(settings, engine=FakeEngine())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with caplog.at_level(logging.WARNING):
            response = await client.get("/v1/responses/resp_x")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "store_unavailable"
    assert str(tmp_path) not in response.text
    match = ERROR_ID.search(error["message"])
    assert match is not None and str(blocker) in caplog.text
    assert match.group(1) in caplog.text


LORA_CONFIG = SimpleNamespace(max_lora_rank=8, max_loras=2, lora_dtype="auto")


def _adapter(root: Path, config: object) -> Path:
    path = root / "adapter"
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("make", "detail"),
    [
        (lambda root: root / "nowhere", "not a directory"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "adapter_config.json"),
        (lambda root: _adapter(root, ["not", "an", "object"]), "does not hold an object"),
        (lambda root: _adapter(root, {"r": 64, "lora_alpha": 16}), "PEFT"),
    ],
)
def test_every_lora_refusal_is_one_message_without_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Callable[[Path], Path], detail: str
) -> None:
    path = make(tmp_path)
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidRequest) as refused:
        check_adapter(str(path), LORA_CONFIG, 1024)
    message = refused.value.message
    assert ERROR_ID.sub("", message) == "The LoRA adapter at lora_path cannot be loaded "
    assert str(tmp_path) not in message and refused.value.param == "lora_path"
    logged = logged_under(caplog, refused.value)
    assert str(path) in logged and detail in logged
