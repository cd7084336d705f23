"""The Grafana dashboard (deploy/grafana/switchboard.json), every query of it evaluated by a
real Prometheus (Debian's, scripts/setup) scraping the live server's /metrics once a
second after traffic on every inference API: each query must parse and answer at least one
series, and each series must carry every label the query groups by (a `by (api)` over a
metric without `api` answers one series with an empty `api`, and a panel of nothing)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets.sync.client

from tests.conftest import ROOT, LiveServer, free_port
from tests.graphpipe_client import Infer, infer_request

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "deploy" / "grafana" / "switchboard.json"
SCRAPE_S = 1
START_S = 30.0


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def _grouped_by(expr: str) -> set[str]:
    return {
        label.strip()
        for group in re.findall(r"\bby \(([^)]*)\)", expr)
        for label in group.split(",")
    } - {"le"}


@pytest.fixture
def prometheus(live_server: LiveServer) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed (scripts/setup installs it)"
    port = free_port()
    target = live_server.base_url.removeprefix("http://")
    with tempfile.TemporaryDirectory(prefix="switchboard-prometheus-") as workdir:
        config = Path(workdir) / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}\n"
            "scrape_configs:\n"
            f"  - job_name: switchboard\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir}/data",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_S
            while True:
                assert process.poll() is None, "prometheus exited"
                try:
                    if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"prometheus not ready in {START_S} s"
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _traffic(live: LiveServer) -> None:
    """A call on each inference API, and a session connection."""
    base = live.base_url
    chat = [{"role": "user", "content": "hi"}]
    for path, body in (
        ("/v1/completions", {"model": "tiny", "prompt": "def f():", "max_tokens": 4}),
        ("/v1/chat/completions", {"model": "tiny", "messages": chat, "max_tokens": 4}),
        ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 4}),
        ("/v1/messages", {"model": "tiny", "messages": chat, "max_tokens": 4}),
    ):
        assert httpx.post(f"{base}{path}", json=body, timeout=60).status_code == 200
    with websockets.sync.client.connect(f"{live.ws_url}/salience/ws") as socket:
        socket.send(json.dumps({"id": "o", "method": "OpenSession", "request": {"model": "tiny"}}))
        assert "response" in json.loads(socket.recv(timeout=60))
    prompts = np.empty(1, dtype=object)
    prompts[:] = [b"import os"]
    request = infer_request(Infer([prompts], config='{"max_tokens": 4}'))
    assert httpx.post(f"{base}/graphpipe", content=request, timeout=60).status_code == 200


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = answer.json()
    assert body.get("status") == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_every_query_of_the_dashboard_answers(live_server: LiveServer, prometheus: str) -> None:
    queries = _queries()
    assert len(queries) >= 20
    _traffic(live_server)
    # Scrapes on both sides of more traffic, so that every rate has two samples and moves.
    deadline = time.monotonic() + 30
    while not _query(prometheus, "count_over_time(up[1m]) >= 3"):
        assert time.monotonic() < deadline, "prometheus did not scrape the server"
        time.sleep(0.5)
    _traffic(live_server)
    time.sleep(2 * SCRAPE_S + 0.5)
    empty = []
    for title, expr in queries:
        result = _query(prometheus, expr)
        if not result:
            empty.append((title, expr))
            continue
        for series in result:
            missing = {label for label in _grouped_by(expr) if not series["metric"].get(label)}
            assert not missing, f"{title}: {expr} answers series without {missing}: {series}"
    assert not empty, f"queries that answer nothing: {empty}"
