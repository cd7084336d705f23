"""The app's objects (`app.objects.AppObjects`), built and closed in one place: with no
engine given, the lifespan starts one, builds on it and stops it last; given one, the
app builds on it at once and leaves it running; either way building opens nothing (a
store's file appears with its first use, not with the app). Fails if the lifespan's
path loses the engine's stop, closes before the app has served, or if building opens
a store."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from app.config import Settings
from app.engine.vllm import startup
from app.main import create_app
from app.objects import AppObjects
from app.telemetry.tracing import Tracing
from tests.fake_engine import FakeEngine


class StoppedEngine(FakeEngine):
    """The fake engine, with the stop a started engine has."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = 0

    def shutdown(self) -> None:
        self.stopped += 1


def _objects(app: FastAPI) -> AppObjects:
    objects = app.state.objects
    assert isinstance(objects, AppObjects)
    return objects


def test_the_lifespan_starts_the_engine_builds_on_it_and_stops_it_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = StoppedEngine()

    async def start_engine(settings: Settings, tracing: Tracing | None) -> StoppedEngine:
        assert tracing is None  # untraced: nothing to lend the engine
        return engine

    monkeypatch.setattr(startup, "start_engine", start_engine)
    app = create_app(Settings(model="fake", responses_store=str(tmp_path / "r.sqlite3")))
    objects = _objects(app)
    assert not hasattr(objects, "engine")  # nothing runs on an engine before it starts
    with TestClient(app) as client:
        assert objects.engine is engine and objects.salience.engine is engine
        assert client.get("/v1/models").json()["data"][0]["id"] == "fake"
        assert engine.stopped == 0
    assert engine.stopped == 1


def test_a_traced_lifespan_lends_the_apps_tracer_to_the_engine_it_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM's spans go out through the app's exporter only if the engine is started with
    the app's tracer (`start_engine` lends it to vLLM before it builds the engine)."""
    engine = StoppedEngine()
    lent: list[Tracing | None] = []

    async def start_engine(settings: Settings, tracing: Tracing | None) -> StoppedEngine:
        lent.append(tracing)
        return engine

    monkeypatch.setattr(startup, "start_engine", start_engine)
    traced = {"otlp_traces_endpoint": "127.0.0.1:9"}  # nothing is exported: no request
    settings = Settings(
        model="fake", engine_args=traced, responses_store=str(tmp_path / "r.sqlite3")
    )
    app = create_app(settings)
    with TestClient(app):
        pass
    tracing = app.state.telemetry.tracing
    assert tracing is not None and lent == [tracing]


def test_an_app_given_an_engine_builds_at_once_opens_nothing_and_leaves_it_running(
    tmp_path: Path,
) -> None:
    engine = StoppedEngine()
    store = tmp_path / "state" / "r.sqlite3"
    app = create_app(Settings(model="fake", responses_store=str(store)), engine=engine)
    assert _objects(app).responses.engine is engine  # no lifespan needed
    with TestClient(app) as client:
        assert client.get("/v1/models").status_code == 200
        assert not store.parent.exists()  # the store opens on its first use
        body = {"model": "fake", "input": "hi", "max_output_tokens": 2}
        assert client.post("/v1/responses", json=body).status_code == 200
        assert store.exists()
    assert engine.stopped == 0  # the giver's to stop


def test_admission_counts_a_unit_at_most_as_the_engines_context() -> None:
    engine = StoppedEngine()
    objects = _objects(create_app(Settings(model="fake"), engine=engine))
    assert objects.admission.max_unit_tokens == engine.info.max_model_len
