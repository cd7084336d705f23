"""A rolling restart and a replica's death under a steady streaming load through vLLM's
router, and another through SMG in its gRPC mode, on the suite's fleet (two replicas, one
Redis, the routers probing every second): what the clients and the fleet's state see.

Once, for the module (`rolled`): stored responses and a Salience session are made; then,
under the load (`app.fleet.load.SteadyLoad`: three clients streaming short chats one
after the other), replica 0 is sent SIGTERM (to its process group, as systemd or Ctrl-C
would), drains, starts again on its ports, and is waited for until the router sends it
work again: a roll's step (the roll of every replica, each step the same, is
bench/fleet_roll.py's). Then a batch and a background response are made on replica 1 and
run there, replica 1's whole process group is killed (SIGKILL: its machine died), replica
0 carries on alone (the batch's requests replica 1 held among them, once their leases
run out), and replica 1 starts again and rejoins. Each replica is restarted once: a
restart costs the suite ~25 s, and once in a few runs minutes (docs/testing.md).

SMG's gRPC mode during the roll (one client of its own): the draining replica's gRPC
health turns NOT_SERVING as its drain begins, so SMG counts it out while it still answers
(SMG's /readiness, watched beside the replica's /ready), and its Generate refuses new
calls UNAVAILABLE as the call's status alone, so SMG retries them on the other replica,
streams included; the restarted replica's service is probed back in.

How these fail: a request of either load fails during the roll (a replica closed its port
while the router still sent to it, or cut a stream, or a refusal reached SMG's client as
a broken stream); SMG counts the draining replica out only once its port closes; a
request that started after the death, or was not running on the dead replica, fails; a
request hangs; a stored response or the Salience session is lost with a replica; a
restarted replica never gets work again
(a router's circuit breaker holding it out); a batch whose replica died never ends, loses
a request or answers one twice, or the replicas disagree on it; a background response
whose server died stays `in_progress`, or its stream hangs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import openai
import pytest
import websockets

from app.fleet.fleet import Fleet
from app.fleet.load import SteadyLoad
from app.fleet.members import Replica
from tests.conftest import LIVE_MODEL
from tests.fleet_setup import DRAIN_TIMEOUT_S, PROBE
from tests.salience_client import ENDLESS, JsonClient, decoded, open_session

pytestmark = pytest.mark.e2e

STREAMS = 3
GRPC_STREAMS = 1  # SMG's gRPC mode: one client, enough to meet the drain's every phase
STORED = 6
ROLLED = 0  # the replica drained and restarted (and drained for good by test_drain.py)
DEAD = 1  # the replica killed
# A restarted replica is back in the router's rotation within its probes' successes
# once ready; what a circuit breaker opened by its death would hold it out for is 60 s.
REJOIN_S = 30.0
# The batch made on the replica that dies: two chunks of the runners' (16 requests each),
# each request a few engine steps, so that the dead replica holds requests unanswered.
BATCH = 20
BATCH_TOKENS = 32
ENDED = ("completed", "failed", "expired", "cancelled")
DEADLINE_S = 120.0
T = TypeVar("T")


def _polled(fetch: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    """`fetch()` again every 0.2 s until `done` holds of it (a replica's state read over
    HTTP: no faster), for at most `DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    while not done(value := fetch()):
        assert time.monotonic() < deadline, f"waited {DEADLINE_S:.0f} s for {what}: {value}"
        time.sleep(0.2)
    return value


def _serving(replica: Replica, timeout_s: float) -> float:
    """Seconds until `replica` is given work (its count of finished requests grows)."""
    started = time.monotonic()
    before = replica.metric("vllm:request_success_total")
    while replica.metric("vllm:request_success_total") == before:
        assert time.monotonic() - started < timeout_s, f"{replica.name} got no work"
        time.sleep(0.2)
    return time.monotonic() - started


def _admitting(replica: Replica, protocol: str, timeout_s: float) -> float:
    """Seconds until `replica` admits work of `protocol` again."""
    started = time.monotonic()
    before = replica.metric("switchboard_admitted_total", protocol=protocol)
    while replica.metric("switchboard_admitted_total", protocol=protocol) == before:
        assert time.monotonic() - started < timeout_s, f"{replica.name} got no {protocol} work"
        time.sleep(0.2)
    return time.monotonic() - started


class _Watch:
    """From another thread, every 0.2 s until stopped: how many workers SMG's gRPC mode
    counts healthy (its /readiness) beside what a replica's /ready answers (None: its
    listener is closed)."""

    def __init__(self, smg: str, replica: Replica) -> None:
        self.seen: list[tuple[int | None, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(smg, replica.url), daemon=True)
        self._thread.start()

    def _run(self, smg: str, replica: str) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.wait(0.2):
                healthy = _get(client, f"{smg}/readiness")
                ready = _get(client, f"{replica}/ready")
                self.seen.append(
                    (
                        None if healthy is None else healthy.json().get("healthy_workers"),
                        None if ready is None else ready.status_code,
                    )
                )

    def stop(self) -> list[tuple[int | None, int | None]]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def _get(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        return client.get(url)
    except httpx.HTTPError:
        return None


async def _salience_session(replica: Replica) -> tuple[str, list[int]]:
    async with websockets.connect(replica.url.replace("http", "ws") + "/salience/ws") as ws:
        client = JsonClient(ws)
        session = await open_session(client, LIVE_MODEL)
        events = await client.generate(
            {"sessionId": session, "appendTokens": ENDLESS, "maxTokens": 4, "topK": 1}
        )
    return session, ENDLESS + decoded(events)


async def _dump(replica: Replica, session: str) -> dict[str, Any]:
    async with websockets.connect(replica.url.replace("http", "ws") + "/salience/ws") as ws:
        return await JsonClient(ws).call("DumpSession", {"sessionId": session})


def _client(replica: Replica) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{replica.url}/v1", api_key="unused", max_retries=0)


def _doomed_work(replica: Replica) -> tuple[str, str]:
    """A batch and a background response made on `replica`, each running there: the
    batch's id and the response's."""
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": LIVE_MODEL,
                "messages": [{"role": "user", "content": f"count {i}"}],
                "max_tokens": BATCH_TOKENS,
                "ignore_eos": True,
            },
        }
        for i in range(BATCH)
    ]
    client = _client(replica)
    upload = client.files.create(
        file=("in.jsonl", "\n".join(json.dumps(line) for line in lines).encode()),
        purpose="batch",
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    body = {
        "model": LIVE_MODEL,
        "input": "a long story",
        "max_output_tokens": 4000,
        "ignore_eos": True,
        "background": True,
    }
    response = httpx.post(f"{replica.url}/v1/responses", json=body, timeout=30).json()
    _polled(
        lambda: replica.metric("switchboard_batch_requests", state="running"),
        lambda running: running > 0,
        "the batch's requests in the doomed replica's engine",
    )
    _polled(
        lambda: httpx.get(f"{replica.url}/v1/responses/{response['id']}", timeout=10).json(),
        lambda stored: stored["status"] == "in_progress",
        "the background response running",
    )
    return batch.id, str(response["id"])


@pytest.fixture(scope="module")
def rolled(fleet: Fleet) -> dict[str, Any]:
    url = fleet.router("vllm-router").url
    seen: dict[str, Any] = {}
    stored = []
    for i in range(STORED):
        body = {"model": LIVE_MODEL, "input": f"keep {i}", "max_output_tokens": 2}
        answer = httpx.post(f"{url}/v1/responses", json=body, timeout=60)
        stored.append(answer.json()["id"])
    session, tokens = asyncio.run(_salience_session(fleet.replica(DEAD)))

    load = SteadyLoad(url, LIVE_MODEL, streams=STREAMS)
    grpc_load = SteadyLoad(fleet.router("smg-grpc").url, LIVE_MODEL, streams=GRPC_STREAMS)
    load.start()
    grpc_load.start()
    try:
        time.sleep(2)  # the load under way on both replicas
        seen["roll_started"] = time.monotonic()
        smg = fleet.router("smg-grpc").url
        watch = _Watch(smg, fleet.replica(ROLLED))
        try:
            # Back with the drain test's drain, which drains it for good after.
            fleet.restart(ROLLED, group=True, drain_timeout_s=DRAIN_TIMEOUT_S)
        finally:
            seen["smg_healthy_and_ready"] = watch.stop()
        seen["rejoined_s"] = _serving(fleet.replica(ROLLED), REJOIN_S)
        seen["grpc_rejoined_s"] = _admitting(fleet.replica(ROLLED), "smg", REJOIN_S)
        seen["grpc_outcomes"] = grpc_load.stop()
        dead = fleet.replica(DEAD)
        seen["batch"], seen["background"] = _doomed_work(dead)
        seen["killed_at"] = time.monotonic()
        dead.kill()
        counts = _client(fleet.replica(1 - DEAD)).batches.retrieve(seen["batch"]).request_counts
        seen["answered_at_death"] = None if counts is None else counts.completed + counts.failed
        time.sleep(PROBE.out_within_s + 2)  # the survivor alone, past the router's probes
        seen["alone_until"] = time.monotonic()
        seen["stored"] = [
            httpx.get(f"{url}/v1/responses/{id_}", timeout=30).status_code for id_ in stored
        ]
        seen["session"] = asyncio.run(_dump(fleet.replica(1 - DEAD), session))
        fleet.restart(DEAD)
        seen["rejoined_after_death_s"] = _serving(dead, REJOIN_S)
    finally:
        seen["outcomes"] = load.stop()
        grpc_load.stop()
    seen["load"] = load
    seen["grpc_load"] = grpc_load
    seen["tokens"] = tokens
    return seen


def test_a_rolling_restart_fails_no_request(rolled: dict[str, Any]) -> None:
    load: SteadyLoad = rolled["load"]
    began, killed = rolled["roll_started"], rolled["killed_at"]
    during = [o for o in load.outcomes if began <= o.started and o.ended < killed]
    assert len(during) > 20, len(during)  # the load ran through the roll
    assert [o for o in during if o.error] == []


def test_a_rolling_restart_through_smgs_grpc_mode_fails_no_request(
    rolled: dict[str, Any],
) -> None:
    """SMG retries what the draining replica refused on the other one, streams included
    (a refusal is the call's status alone: its start fails, where a stream that began
    and broke would reach the client as an error event)."""
    load: SteadyLoad = rolled["grpc_load"]
    during = [o for o in load.outcomes if rolled["roll_started"] <= o.started]
    assert len(during) > 10, len(during)  # the load ran through the roll
    assert [o for o in load.outcomes if o.error] == []
    assert rolled["grpc_rejoined_s"] <= REJOIN_S


def test_smgs_grpc_mode_counts_a_draining_replica_out_while_it_answers(
    rolled: dict[str, Any],
) -> None:
    """The drained replica's gRPC health turns NOT_SERVING as its drain begins, so SMG
    counts it out (one healthy worker) while its listener is still open (/ready 503,
    for the drain's grace), not only once its port has closed."""
    seen = rolled["smg_healthy_and_ready"]
    assert (1, 503) in seen, seen


def test_a_restarted_replica_gets_work_again(rolled: dict[str, Any]) -> None:
    assert rolled["rejoined_s"] <= REJOIN_S
    assert rolled["rejoined_after_death_s"] <= REJOIN_S


def test_a_death_ends_only_the_streams_the_dead_replica_held(rolled: dict[str, Any]) -> None:
    """At most one request per client fails, each one running when the replica died; every
    request started after the death succeeds (the router retries a connection refused
    on the survivor until its probes take the dead one out); none hangs."""
    load: SteadyLoad = rolled["load"]
    killed = rolled["killed_at"]
    failed = [o for o in load.outcomes if o.error and o.ended >= killed]
    assert len(failed) <= STREAMS, failed
    for outcome in failed:
        assert outcome.started <= killed <= outcome.ended, outcome
    assert not any("Timeout" in (o.error or "") for o in load.outcomes)
    after = [o for o in load.outcomes if killed < o.started <= rolled["alone_until"]]
    assert after and not any(o.error for o in after)


def test_a_death_loses_no_stored_response_or_session(rolled: dict[str, Any]) -> None:
    assert rolled["stored"] == [200] * STORED
    dumped = rolled["session"]
    assert "error" not in dumped, dumped
    assert dumped["response"]["tokens"] == rolled["tokens"]


def test_a_batch_outlives_the_replica_it_ran_on(fleet: Fleet, rolled: dict[str, Any]) -> None:
    """The batch made on the replica that died ends `completed` with every request
    answered exactly once, and both replicas (the restarted one too) answer the same."""
    assert rolled["answered_at_death"] is not None
    assert rolled["answered_at_death"] < BATCH  # the death left requests unanswered
    batches = [_client(replica) for replica in fleet.replicas]
    ended = _polled(
        lambda: batches[0].batches.retrieve(rolled["batch"]),
        lambda batch: batch.status in ENDED,
        "the batch to end",
    )
    assert ended.status == "completed", ended
    assert ended.request_counts is not None
    assert (ended.request_counts.completed, ended.request_counts.failed) == (BATCH, 0)
    assert ended.output_file_id is not None and ended.error_file_id is None
    output = batches[1].files.content(ended.output_file_id).text
    lines = [json.loads(line) for line in output.splitlines() if line]
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(BATCH)]
    for line in lines:
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["usage"]["completion_tokens"] == BATCH_TOKENS
    assert batches[1].batches.retrieve(rolled["batch"]).status == "completed"
    assert batches[0].files.content(ended.output_file_id).text == output


def test_a_background_response_whose_server_died_ends_failed(
    fleet: Fleet, rolled: dict[str, Any]
) -> None:
    """Read from the survivor once its lease ran out: failed, with the reason; its stream
    ends (it hung, and the response stayed in_progress, for the store's 30 days)."""
    url = f"{fleet.replica(1 - DEAD).url}/v1/responses/{rolled['background']}"
    response = httpx.get(url, timeout=30).json()
    assert response["status"] == "failed", response
    assert response["error"]["code"] == "server_error"
    with httpx.stream("GET", url, params={"stream": "true"}, timeout=30) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("event:")]
    assert events[-1] == "event: response.failed", events
