"""A server that listens beyond this machine never runs without a key: `switchboard
serve` on a wildcard or a routable address with no key generates one and shows it once
in its log (the shipped compose files and manifests listened on 0.0.0.0 keyless);
loopback, and a key the operator sets, are left as they are. The compose files and the
manifest carry the key the operator sets."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from app.cli import keyed_if_exposed
from app.config import Settings
from app.main import create_app
from tests.fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "switchboard.internal"])
async def test_an_exposed_keyless_server_gets_a_key_shown_once(
    host: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        settings = keyed_if_exposed(Settings(model="fake", host=host))
    key = settings.api_key
    assert key is not None and key.startswith("sk-") and len(key) > 40
    assert [r.getMessage().count(key) for r in caplog.records] == [1]
    app = create_app(settings, engine=FakeEngine())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/v1/models")).status_code == 401
        headers = {"authorization": f"Bearer {key}"}
        assert (await client.get("/v1/models", headers=headers)).status_code == 200
        assert (await client.get("/health")).status_code == 200  # probes need no key


@pytest.mark.parametrize(
    "settings",
    [
        Settings(model="fake", host="127.0.0.1"),
        Settings(model="fake", host="localhost"),
        Settings(model="fake", host="::1"),
        Settings(model="fake", host="0.0.0.0", api_key="sk-mine"),
        Settings(model="fake", host="0.0.0.0", tenant_api_key=["acme:k"]),
    ],
)
def test_loopback_and_a_set_key_are_left_as_they_are(settings: Settings) -> None:
    assert keyed_if_exposed(settings) == settings


def test_an_empty_key_is_no_key() -> None:
    assert Settings(model="fake", api_key="").api_key is None


def test_the_shipped_deployments_carry_a_key() -> None:
    single = (ROOT / "docker-compose.yml").read_text()
    assert "SWITCHBOARD_API_KEY: ${SWITCHBOARD_API_KEY:-}" in single  # or one generated
    fleet = (ROOT / "deploy/fleet/docker-compose.yml").read_text()
    assert "SWITCHBOARD_API_KEY: ${SWITCHBOARD_API_KEY:?" in fleet  # the replicas share it
    manifest = (ROOT / "deploy/kubernetes/switchboard.yaml").read_text()
    assert "name: SWITCHBOARD_API_KEY" in manifest and "secretKeyRef" in manifest
