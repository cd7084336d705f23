"""The response store across an app's restart and when it cannot be reached, on the live
server's engine: a store that is down fails only the calls that need it, and the SQLite
store keeps its responses across an app's restart. Across replicas (two processes and
engines sharing Redis): tests/fleet/test_responses_replicas.py, on the suite's fleet.

How these fail: a down store breaks `store: false` calls, or answers something other than
503 `store_unavailable`; a restarted app cannot read what it stored.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, free_port
from tests.replicas import app_on_live_engine

pytestmark = pytest.mark.e2e


def test_a_store_that_is_down_fails_only_the_calls_that_need_it(live_server: LiveServer) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with app_on_live_engine(live_server, responses_store=down) as replica:
        base = {"model": "tiny", "input": "x", "max_output_tokens": 3}
        unstored = httpx.post(f"{replica}/v1/responses", json={**base, "store": False}, timeout=60)
        assert unstored.status_code == 200 and unstored.json()["status"] in (
            "completed",
            "incomplete",
        )
        for answer in (
            httpx.post(f"{replica}/v1/responses", json=base, timeout=60),
            httpx.post(
                f"{replica}/v1/responses",
                json={**base, "previous_response_id": "resp_x"},
                timeout=60,
            ),
            httpx.get(f"{replica}/v1/responses/resp_x"),
            httpx.post(f"{replica}/v1/responses", json={**base, "background": True}, timeout=60),
        ):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "store_unavailable"
        streamed = httpx.post(f"{replica}/v1/responses", json={**base, "stream": True}, timeout=60)
        events = [line for line in streamed.text.splitlines() if line.startswith("event: ")]
        assert events[-2:] == ["event: error", "event: response.failed"], events
        assert "store_unavailable" in streamed.text
    assert live_server.wait_idle() == 0


def test_sqlite_keeps_responses_across_a_restart(live_server: LiveServer, tmp_path: Path) -> None:
    store = str(tmp_path / "state" / "responses.sqlite3")
    with app_on_live_engine(live_server, responses_store=store) as before:
        first = httpx.post(
            f"{before}/v1/responses",
            json={"model": "tiny", "input": "remember me", "max_output_tokens": 4},
            timeout=60,
        ).json()
    with app_on_live_engine(live_server, responses_store=store) as after:
        assert httpx.get(f"{after}/v1/responses/{first['id']}").json() == first
        follow_up = httpx.post(
            f"{after}/v1/responses",
            json={
                "model": "tiny",
                "input": "and now?",
                "previous_response_id": first["id"],
                "max_output_tokens": 4,
            },
            timeout=60,
        )
        assert follow_up.status_code == 200, follow_up.text
