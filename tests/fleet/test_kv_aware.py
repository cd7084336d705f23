"""vLLM's KV-cache events leave a Switchboard replica, and vLLM's router places requests
by them (`kv_aware`).

Each fleet replica runs vLLM's ZMQ publisher (`--kv-events-config`, app/fleet): a
subscriber of its own sees the blocks a request stored, with their token ids and, for a
LoRA adapter's request, the adapter's name among each block's `extra_keys` (what llm-d's
precise prefix-cache scorer hashes), and `/kv_event_sources` names the publisher. Then a
`kv_aware` vllm-router is put in front of the fleet, and a conversation's first turn is
sent to one replica directly, behind the router's back: its next turn, through the
router, goes to that replica, which only the events can have told it (the router never
saw the first turn; with nothing to tell them apart, it sends every request to the first
replica). Both replicas are primed in turn, each more than once.

How these fail: no events leave a replica (the publisher is off, or binds elsewhere); the
router cannot read them (their format, block size or model identity); or it cannot price
a request's prefix (it renders chat requests on the replicas' /render routes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from app.fleet.fleet import Fleet, RouterSpec
from app.fleet.members import Replica, Router
from app.fleet.routers import VLLM_ROUTER
from tests.conftest import LIVE_LORA, LIVE_MODEL

pytestmark = pytest.mark.e2e

# Longer than a few of the CPU engine's 128-token blocks, different for each conversation.
SYSTEM = " ".join(f"rule {i} of conversation {{n}}: be brief." for i in range(60))
PRIMED = 3  # conversations primed on each replica


def _chat(url: str, n: int, turns: int, model: str = LIVE_MODEL) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM.format(n=n)}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {turn}"})
    body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    answer.raise_for_status()
    return dict(answer.json())


@pytest.fixture(scope="module")
def kv_router(fleet: Fleet) -> Iterator[Router]:
    router = fleet.add_router("kv_aware", RouterSpec(VLLM_ROUTER, "kv_aware"))
    try:
        yield router
    finally:
        fleet.remove_router("kv_aware")


def test_a_replica_publishes_the_blocks_it_stores(fleet: Fleet) -> None:
    replica = fleet.replica(0)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    with context.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(replica.kv_events_endpoint)
        time.sleep(0.5)  # a subscription made as a message is published may miss it
        _chat(replica.url, 1000, 1)
        _chat(replica.url, 1001, 1, model=LIVE_LORA)
        stored: dict[str | None, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + 30
        while len(stored) < 2 and time.monotonic() < deadline:
            if sub.poll(1000):
                _topic, _seq, payload = sub.recv_multipart()
                _ts, events, *_ = msgspec.msgpack.decode(payload)
                for e in events:
                    if e.get("type") == "BlockStored":
                        stored.setdefault(e.get("lora_name"), []).append(e)
    assert set(stored) == {None, LIVE_LORA}, f"stored blocks in 30 s: {list(stored)}"
    block_size = replica.block_size()
    for events in stored.values():
        # An event stores a run of whole blocks: its hashes, and every token they hold.
        assert all(e["block_size"] == block_size for e in events), events
        assert all(len(e["token_ids"]) == block_size * len(e["block_hashes"]) for e in events)
    # The adapter's blocks name it first among each block's extra keys (what llm-d's
    # precise prefix-cache scorer hashes with the tokens); the base model's name none.
    for e in stored[LIVE_LORA]:
        assert len(e["extra_keys"]) == len(e["block_hashes"])
        assert all(keys[0] == LIVE_LORA for keys in e["extra_keys"]), e["extra_keys"]
    assert all(not any(e.get("extra_keys") or ()) for e in stored[None]), stored[None]
    # The publisher as vLLM's engine client reports it, rank 0 on the replica's port.
    sources = httpx.get(f"{replica.url}/kv_event_sources", timeout=10).json()
    assert list(sources) == ["0"]
    assert sources["0"]["endpoint"] == f"tcp://*:{replica.kv_events_port}"
    assert sources["0"]["enable_kv_cache_events"] is True


def _served(replica: Replica) -> float:
    return replica.metric("vllm:request_success_total")


def test_kv_aware_sends_a_turn_where_its_prefix_is(fleet: Fleet, kv_router: Router) -> None:
    replicas = fleet.replicas
    chosen = []
    for n in range(2 * PRIMED):
        primed = replicas[n % 2]
        _chat(primed.url, n, 1)  # behind the router's back
        time.sleep(0.5)  # the events on their way
        before = [_served(r) for r in replicas]
        _chat(kv_router.url, n, 2)
        after = [_served(r) for r in replicas]
        went = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
        chosen.append((n % 2, went))
    assert all(went == [primed] for primed, went in chosen), chosen
