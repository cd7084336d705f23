"""The fleet's fixture (tests/fleet_setup.py builds and launches it) and what its tests
read off the replicas: which replica served what, by vLLM's and admission's own counters
on each replica's /metrics (the routers do not say where they sent a request)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from app.fleet.fleet import Fleet


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    from tests.fleet_setup import started, stop

    try:
        yield started()
    finally:
        stop()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples on the replica at `url` whose labels include `labels`."""
    body = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for found in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", body, re.M):
        sample = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or ""))
        if all(sample.get(k) == v for k, v in labels.items()):
            total += float(found.group(2))
    return total


def admitted(fleet: Fleet, protocol: str) -> list[float]:
    """Each replica's count of admitted units of work of `protocol`."""
    return [
        metric(r.url, "switchboard_admitted_total", protocol=protocol)
        for r in fleet.members_replicas
    ]
