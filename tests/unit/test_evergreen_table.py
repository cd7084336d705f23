"""The Evergreen node transition table itself: every entry is exercised by a scenario that
puts a node in the entry's state and sends a fragment of the entry's event, and random
fragment streams never produce a (state, event) pair the table lacks."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import SwitchboardError
from app.protocols.evergreen.generate import OUTPUT_METADATA, GeneratePlan
from app.protocols.evergreen.session import (
    TRANSITIONS,
    Event,
    Limits,
    NodeState,
    Outcome,
    Session,
)
from schemas import evergreen_pb2 as pb
from schemas import evergreen_service_pb2 as service_pb
from tests.evergreen_frames import planner

TEXT = 'metadata { mimetype: "text/plain" }'
S, E = NodeState, Event
# (state, event) -> (messages that put node "n" in `state`, the fragment of `event`)
SCENARIOS: dict[tuple[NodeState, Event], tuple[list[str], str]] = {
    (S.ABSENT, E.FRESH): ([], f'id: "n" chunk_fragment {{ {TEXT} data: "a" }}'),
    (S.ABSENT, E.MIXED): ([], f'id: "n" child_ids: "c" chunk_fragment {{ {TEXT} }}'),
    (S.ABSENT, E.NO_METADATA): ([], 'id: "n" chunk_fragment { data: "a" }'),
    (S.OPEN, E.FRESH): (
        [f'id: "n" continued: true chunk_fragment {{ {TEXT} data: "a" }}'],
        'id: "n" seq: 1 chunk_fragment { data: "b" }',
    ),
    (S.OPEN, E.REPEAT): (
        [f'id: "n" continued: true chunk_fragment {{ {TEXT} data: "a" }}'],
        f'id: "n" chunk_fragment {{ {TEXT} data: "other" }}',
    ),
    (S.OPEN, E.PAST_FINAL): (
        ['id: "n" seq: 1 chunk_fragment { data: "b" }'],
        'id: "n" seq: 2 chunk_fragment { data: "c" }',
    ),
    (S.OPEN, E.MIXED): (
        ['id: "n" continued: true child_ids: "c"'],
        f'id: "n" seq: 1 chunk_fragment {{ {TEXT} }}',
    ),
    (S.OPEN, E.METADATA_CHANGED): (
        [f'id: "n" continued: true chunk_fragment {{ {TEXT} data: "a" }}'],
        'id: "n" seq: 1 chunk_fragment { metadata { mimetype: "text/html" } data: "b" }',
    ),
    (S.OPEN, E.NO_METADATA): (
        ['id: "n" continued: true'],
        'id: "n" seq: 1 chunk_fragment { data: "b" }',
    ),
    (S.COMPLETE, E.REPEAT): (
        [f'id: "n" chunk_fragment {{ {TEXT} data: "a" }}'],
        'id: "n" child_ids: "c"',
    ),
    (S.COMPLETE, E.PAST_FINAL): (
        [f'id: "n" chunk_fragment {{ {TEXT} data: "a" }}'],
        'id: "n" seq: 1 chunk_fragment { data: "b" }',
    ),
    (S.PRODUCED, E.NOT_YOURS): ([], f'id: "n" chunk_fragment {{ {TEXT} data: "a" }}'),
}


def new_session() -> Session[GeneratePlan]:
    return Session(Limits(), planner())


def fragment(text: str) -> service_pb.SessionMessage:
    message = service_pb.SessionMessage()
    message.node_fragments.append(text_format.Parse(text, pb.NodeFragment()))
    return message


def test_every_entry_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(TRANSITIONS)


@pytest.mark.parametrize("key", list(SCENARIOS), ids=lambda k: f"{k[0].value}-{k[1].value}")
def test_entry(key: tuple[NodeState, Event], monkeypatch: pytest.MonkeyPatch) -> None:
    state, event = key
    setup, sent = SCENARIOS[key]
    session = new_session()
    if state is S.PRODUCED:
        action = 'actions { name: "GENERATE" inputs { name: "prompt" id: "p" } '
        action += 'outputs { name: "response" id: "n" } }'
        session.receive(text_format.Parse(action, service_pb.SessionMessage()))
    for text in setup:
        session.receive(fragment(text))
    assert session.state_of("n") is state

    seen: list[Event] = []
    classify = Session._classify

    def spy(self: Session[Any], node: Any, frag: pb.NodeFragment) -> Event:
        seen.append(classify(self, node, frag))
        return seen[-1]

    monkeypatch.setattr(Session, "_classify", spy)
    outcome = TRANSITIONS[key]
    if outcome is Outcome.ABORT:
        with pytest.raises(SwitchboardError):
            session.receive(fragment(sent))
        assert session.ended is not None
    else:
        pieces_before = session.node_count, session.bytes_held
        session.receive(fragment(sent))
        changed = (session.node_count, session.bytes_held) != pieces_before
        assert changed is (outcome is Outcome.STORE)
        assert session.ended is None
    assert seen == [event]


# Random streams of fragments over a few ids and seqs: whatever arrives, the core either
# stores, ignores or aborts through the table, and never fails any other way.
_ids = st.sampled_from(["a", "b", "c"])
_fragment = st.builds(
    lambda node_id, seq, continued, kind, mime: pb.NodeFragment(
        id=node_id,
        seq=seq,
        continued=continued,
        child_ids=[kind] if kind in ("a", "b", "c") else [],
        **(
            {"chunk_fragment": pb.Chunk(metadata=pb.ChunkMetadata(mimetype=mime), data=b"x")}
            if kind == "chunk" and mime
            else {"chunk_fragment": pb.Chunk(data=b"x")}
            if kind == "chunk"
            else {}
        ),
    ),
    _ids,
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from(["a", "b", "c", "chunk", "none"]),
    st.sampled_from(["", "text/plain", "text/html"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_fragment, max_size=12), st.booleans())
def test_random_streams_stay_in_the_table(
    fragments: list[pb.NodeFragment], with_action: bool
) -> None:
    session = new_session()
    pairs: list[tuple[NodeState, Event]] = []
    classify = Session._classify

    def spy(self: Session[Any], node: Any, frag: pb.NodeFragment) -> Event:
        event = classify(self, node, frag)
        pairs.append((node.state, event))
        return event

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Session, "_classify", spy)
        if with_action:
            action = 'actions { name: "GENERATE" inputs { name: "prompt" id: "a" } '
            action += 'outputs { name: "response" id: "c" } }'
            session.receive(text_format.Parse(action, service_pb.SessionMessage()))
        for frag in fragments:
            try:
                ready = session.receive(service_pb.SessionMessage(node_fragments=[frag]))
            except SwitchboardError:
                break
            for action_ready in ready:
                session.leaves(action_ready.plan.input_ids[0])
                session.emit("c", b"out", True, OUTPUT_METADATA)
                session.finish(action_ready.index)
    assert all(pair in TRANSITIONS for pair in pairs), pairs
