"""The fleet's own files, no process started: the command lines `app.fleet` gives the
routers and nginx, the GPU host's compose file and nginx.conf (deploy/fleet/) kept in
step with them, and the engine hold's socket (app/engine/vllm/hold.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from app.engine.vllm import hold
from app.fleet.members import Replica
from app.fleet.routers import (
    KvIdentity,
    Probe,
    nginx_conf,
    probe_flags,
    smg_argv,
    vllm_router_argv,
)

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "deploy" / "fleet"


def _flags(argv: list[str]) -> dict[str, list[str]]:
    """Each --flag with the values after it (a repeated flag's values joined)."""
    flags: dict[str, list[str]] = {}
    current = None
    for arg in argv:
        if arg.startswith("--"):
            current = arg
            flags.setdefault(current, [])
        elif current is not None:
            flags[current].append(arg)
    return flags


def _replicas(tmp_path: Path) -> list[Replica]:
    return [Replica(f"replica-{i}", tmp_path) for i in range(2)]


def test_both_routers_probe_readiness_every_second(tmp_path: Path) -> None:
    replicas = _replicas(tmp_path)
    probe = Probe()
    for argv in (
        vllm_router_argv(replicas, "round_robin", 9000, probe),
        smg_argv(replicas, "round_robin", 9000, probe),
    ):
        flags = _flags(argv)
        assert flags["--health-check-endpoint"] == ["/ready"]
        assert flags["--health-check-interval-secs"] == [str(probe.interval_s)]
        assert flags["--worker-urls"] == [r.url for r in replicas]


def test_kv_aware_reads_each_replicas_events_as_its_engine_writes_them(tmp_path: Path) -> None:
    replicas = _replicas(tmp_path)
    argv = vllm_router_argv(replicas, "kv_aware", 9000, Probe(), KvIdentity("tiny", 128))
    flags = _flags(argv)
    assert flags["--kv-event-source"] == [f"{r.url}={r.kv_events_endpoint}" for r in replicas]
    assert flags["--kv-event-block-size"] == ["128"] and flags["--kv-event-model"] == ["tiny"]
    serve = _flags(replicas[0].command())
    port = replicas[0].kv_events_port
    assert f'"endpoint": "tcp://*:{port}"' in serve["--kv-events-config"][0]  # bound


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FLEET / "docker-compose.yml").read_text())
    return loaded


def test_the_compose_router_is_the_fleets(tmp_path: Path) -> None:
    """The GPU host's router runs the flags `switchboard fleet` gives it, in front of
    every replica service, reading each one's KV events."""
    services = _compose()["services"]
    replicas = sorted(name for name in services if name.startswith("replica-"))
    flags = _flags(services["router"]["command"])
    ours = _flags(vllm_router_argv(_replicas(tmp_path), "kv_aware", 8000, Probe()))
    for flag in _flags(probe_flags(Probe())):  # probes, retries, breaker
        assert flags[flag] == ours[flag], flag
    assert flags["--worker-urls"] == [f"http://{name}:8000" for name in replicas]
    assert flags["--kv-event-source"] == [
        f"http://{name}:8000=tcp://{name}:5557" for name in replicas
    ]
    for name in replicas:
        serve = _flags(services[name]["command"])
        assert serve["--responses-store"] == ["redis://redis:6379/0"]
        assert '"endpoint": "tcp://*:5557"' in serve["--kv-events-config"][0]


def _locations(conf: str) -> list[list[str]]:
    """Each `location` block's directives, addresses and upstream names aside."""
    blocks = re.findall(r"location / \{(.*?)\}", conf, re.S)
    return [
        sorted(
            line.strip() for line in block.strip().splitlines() if not line.strip().startswith("#")
        )
        for block in blocks
    ]


def test_the_compose_nginx_is_the_fleets(tmp_path: Path) -> None:
    static = (FLEET / "nginx.conf").read_text()
    generated = nginx_conf(_replicas(tmp_path), 8080, 50051, tmp_path)
    assert _locations(static) == _locations(generated)
    services = _compose()["services"]
    replicas = sorted(name for name in services if name.startswith("replica-"))
    assert re.findall(r"server (replica-\d+):8000;", static) == replicas
    assert re.findall(r"server (replica-\d+):50051;", static) == replicas


def test_the_engine_hold_is_a_name_taken_until_released() -> None:
    held = hold.EngineHold()
    try:
        assert hold.held(held.name)
    finally:
        held.release()
    assert not hold.held(held.name)
    held.release()  # idempotent


def test_the_plugin_leaves_the_server_itself_alone() -> None:
    """vLLM loads the plugin in the server's process too: its handlers stay as they are."""
    import signal

    before = {sig: signal.getsignal(sig) for sig in hold.SIGNALS}
    held = hold.EngineHold()
    try:
        with held.announced():
            hold.install()
        assert {sig: signal.getsignal(sig) for sig in hold.SIGNALS} == before
        assert hold.ENV not in os.environ  # nothing started later inherits it
    finally:
        held.release()
