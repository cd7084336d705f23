"""The fleet's fixture (tests/fleet_setup.py builds and launches it) and what its tests
read off the replicas: which replica served what, by vLLM's and admission's own counters
on each replica's /metrics (the routers do not say where they sent a request)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.fleet.fleet import Fleet


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    from tests.fleet_setup import started, stop

    try:
        yield started()
    finally:
        stop()


def admitted(fleet: Fleet, protocol: str) -> list[float]:
    """Each replica's count of admitted units of work of `protocol`."""
    return [r.metric("switchboard_admitted_total", protocol=protocol) for r in fleet.replicas]
