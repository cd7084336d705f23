"""A rolling restart and a death under streaming load, at a larger scale than the suite's
test (issue 30 items 3-4): what clients see through each router.

Each target starts a fresh fleet (`app.fleet`: two replicas of the tiny model sharing a
Redis, one router probing /ready every second) and puts STREAMS clients on it
(`app.fleet.load.SteadyLoad`: short streamed chats, one after the other). Then, in order:
a quiet window (the baseline), every replica restarted in turn (SIGTERM to its process
group, drained, started again, waited for until the router gives it work), a second
quiet window, replica 0 killed (SIGKILL to its group) and started again. Per phase:
requests, failures, and TTFT p50 and p99; for the death, the streams cut and whether any
request that started after it failed.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/fleet_roll.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import (
    _8K,
    TINY_8K,
    Figures,
    Round,
    Target,
    markdown_table,
    publish,
    run_rounds,
    spread,
    tiny_model,
)

from app.fleet.fleet import Fleet, RouterSpec, running
from app.fleet.load import Outcome, SteadyLoad
from app.fleet.members import Replica
from app.fleet.routers import SMG, VLLM_ROUTER

NAME = "fleet_roll"
STREAMS = 8
QUIET_S = 20.0
REJOIN_S = 120.0

TARGETS = {
    "vllm-router": RouterSpec(VLLM_ROUTER, "round_robin"),
    "smg": RouterSpec(SMG, "round_robin"),
}


def _serving(replica: Replica) -> None:
    started = time.monotonic()
    before = replica.metric("vllm:request_success_total")
    while replica.metric("vllm:request_success_total") == before:
        if time.monotonic() - started > REJOIN_S:
            raise TimeoutError(f"{replica.name} got no work in {REJOIN_S} s")
        time.sleep(0.2)


def _phase(outcomes: list[Outcome], start: float, end: float) -> Figures:
    mine = [o for o in outcomes if start <= o.started < end]
    ttfts = sorted(o.ttft_s for o in mine if o.ttft_s is not None)
    return {
        "requests": len(mine),
        "failures": sum(1 for o in mine if o.error),
        "ttft_p50_ms": statistics.median(ttfts) * 1e3 if ttfts else 0.0,
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] * 1e3 if ttfts else 0.0,
        "seconds": end - start,
    }


def measure(router: RouterSpec) -> Callable[[Round, Path], Figures]:
    def run(round_: Round, log: Path) -> Figures:
        workdir = Path(tempfile.mkdtemp(prefix="fleet-roll-", dir=log.parent))
        serve = [
            "--model", str(tiny_model(TINY_8K, *_8K)),
            "--served-model-name", "tiny",
            "--dtype", "float32",
            "--max-model-len", "2048",
            "--log-level", "warning",
        ]  # fmt: skip
        fleet = Fleet(workdir, serve, routers={"router": router})
        with running(fleet):
            load = SteadyLoad(fleet.router().url, "tiny", streams=STREAMS)
            load.start()
            try:
                marks = {"start": time.monotonic()}
                time.sleep(QUIET_S)
                marks["roll"] = time.monotonic()
                restarts = []
                for i, replica in enumerate(fleet.replicas):
                    began = time.monotonic()
                    fleet.restart(i, group=True)
                    restarts.append(time.monotonic() - began)
                    _serving(replica)
                marks["rolled"] = time.monotonic()
                time.sleep(QUIET_S)
                marks["kill"] = time.monotonic()
                fleet.replica(0).kill()
                fleet.restart(0)
                _serving(fleet.replica(0))
                marks["end"] = time.monotonic()
            finally:
                outcomes = load.stop()
        killed = marks["kill"]
        cut = [o for o in outcomes if o.error and o.started <= killed <= o.ended]
        after = [o for o in outcomes if o.error and o.started > killed]
        return {
            "baseline": _phase(outcomes, marks["start"], marks["roll"]),
            "roll": _phase(outcomes, marks["roll"], marks["rolled"]),
            "death": {
                **_phase(outcomes, marks["kill"], marks["end"]),
                "cut": len(cut),
                "failed_after": len(after),
            },
            "restart_s": restarts,
        }

    return run


def table(results: Any) -> str:
    rows = []
    for name in TARGETS:

        def cell(phase: str, key: str, digits: int = 0, name: str = name) -> str:
            return spread(results.per_round(name, phase, key), digits)

        rows.append(
            [
                name,
                cell("roll", "requests"),
                cell("roll", "failures"),
                f"{cell('baseline', 'ttft_p99_ms')} / {cell('roll', 'ttft_p99_ms')}",
                cell("death", "requests"),
                f"{cell('death', 'cut')} of {STREAMS}",
                cell("death", "failed_after"),
            ]
        )
    header = [
        "router",
        "requests during the roll",
        "failed",
        "TTFT p99 (ms): quiet / rolling",
        "requests after the death",
        "streams cut by it",
        "failed that started after it",
    ]
    return "\n".join(markdown_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    targets = [Target(name, child=measure(router)) for name, router in TARGETS.items()]
    results = run_rounds(targets, lambda server, round_: {}, rounds=args.rounds, name=NAME)
    figures = {"workload": {"streams": STREAMS, "quiet_s": QUIET_S}, **results.record()}
    publish(NAME, figures, table(results))


if __name__ == "__main__":
    main()
