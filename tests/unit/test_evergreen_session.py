"""The Evergreen session core beyond its golden transcripts: what it keeps of a client's
message, and what its walks cost on inputs built to make them expensive."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from app.errors import ResourceExhausted
from app.protocols.evergreen.generate import GeneratePlan
from app.protocols.evergreen.session import Limits, Session
from schemas import evergreen_service_pb2 as service_pb
from tests.evergreen_frames import message, planner


def new_session(**limits: Any) -> Session[GeneratePlan]:
    return Session(Limits(**limits), planner())


def test_the_session_keeps_its_own_copy_of_metadata() -> None:
    # A submessage of the client's message is a view into the whole frame's memory: a
    # session that kept one would keep every frame alive, uncounted by max_bytes.
    session = new_session()
    sent = message(
        'node_fragments { id: "a" chunk_fragment { metadata { mimetype: "text/plain" } '
        'data: "x" } }'
    )
    session.receive(sent)
    session.receive(
        message(
            'actions { name: "GENERATE" inputs { name: "prompt" id: "a" } '
            'outputs { name: "response" id: "r" } }'
        )
    )
    sent.node_fragments[0].chunk_fragment.metadata.mimetype = "image/png"
    (leaf,) = session.leaves("a")
    assert leaf.metadata.mimetype == "text/plain"


@pytest.mark.timeout(60)
def test_flattening_shared_nodes_without_chunks_ends() -> None:
    # 4 levels of 100 children each, all one node without a chunk: 10^8 visits that
    # yield no chunk, in 400 bytes of child ids. The walk used to count only chunks.
    session = new_session()
    session.receive(message('node_fragments { id: "e" }'))
    below = "e"
    for level in range(4):
        node = service_pb.SessionMessage()
        node.node_fragments.add(id=f"n{level}", child_ids=[below] * 100)
        session.receive(node)
        below = f"n{level}"
    session.receive(
        message(
            f'actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "{below}" }} '
            'outputs { name: "response" id: "r" } }'
        )
    )
    with pytest.raises(ResourceExhausted, match="flattens to more than 10000 nodes"):
        session.leaves(below)


def work(scenario: Callable[[int], object], n: int) -> int:
    """Python and C calls made while `scenario(n)` runs: a measure of the work done that,
    unlike a duration, does not depend on the machine."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += 1

    sys.setprofile(count)
    try:
        scenario(n)
    finally:
        sys.setprofile(None)
    return calls


def generate(prompt: str) -> service_pb.SessionMessage:
    return message(
        f'actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "{prompt}" }} '
        'outputs { name: "response" id: "r" } }'
    )


def leaf(node_id: str) -> service_pb.SessionMessage:
    return message(
        f'node_fragments {{ id: "{node_id}" chunk_fragment {{ '
        'metadata { mimetype: "text/plain" } data: "x" } }'
    )


def shared_subtree(n: int) -> None:
    """A node with n children that never arrive, then n parents of it."""
    session = new_session()
    wide = service_pb.SessionMessage()
    wide.node_fragments.add(id="x", child_ids=[f"c{i}" for i in range(n)])
    session.receive(wide)
    for i in range(n):
        parent = service_pb.SessionMessage()
        parent.node_fragments.add(id=f"p{i}", child_ids=["x"])
        session.receive(parent)


def leaves_after_their_action(n: int) -> None:
    """The action first (as the spec encourages), its prompt's n leaves one by one."""
    session = new_session()
    session.receive(generate("p"))
    root = service_pb.SessionMessage()
    root.node_fragments.add(id="p", child_ids=[f"c{i}" for i in range(n)])
    session.receive(root)
    for i in range(n):
        session.receive(leaf(f"c{i}"))


def streamed_root_after_its_action(n: int) -> None:
    """The action first, then its prompt's root streamed one child per fragment."""
    session = new_session()
    session.receive(generate("p"))
    for i in range(n):
        part = service_pb.SessionMessage()
        part.node_fragments.add(id="p", seq=i, continued=True, child_ids=[f"c{i}"])
        session.receive(part)


@pytest.mark.parametrize(
    "scenario", [shared_subtree, leaves_after_their_action, streamed_root_after_its_action]
)
def test_a_fragment_costs_the_same_however_big_the_session(
    scenario: Callable[[int], None],
) -> None:
    # Twice the fragments, about twice the work. Each fragment used to walk every node
    # below it or every waiting action's tree: four times the work, 10^8 steps (tens of
    # seconds of a blocked event loop) within the default limits.
    assert work(scenario, 600) < 2.5 * work(scenario, 300)


def waiting_actions(n: int) -> Callable[[int], None]:
    """n actions waiting on prompts that never come; then, `leaves(k)` sends k leaves."""
    session = new_session()
    for i in range(n):
        session.receive(
            message(
                f'actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "p{i}" }} '
                f'outputs {{ name: "response" id: "r{i}" }} }}'
            )
        )

    def leaves(k: int) -> None:
        for i in range(k):
            session.receive(leaf(f"c{i}"))

    return leaves


def test_a_leaf_costs_no_more_than_a_look_at_each_waiting_action() -> None:
    # Whether actions wait on each other is asked again only when an action arrives or
    # an input tree comes to hold another's output, not for every message: that cost
    # (waiting actions)^2 lookups, 140 times the cost of a leaf at 64 of them.
    assert work(waiting_actions(64), 200) < 2.5 * work(waiting_actions(32), 200)
