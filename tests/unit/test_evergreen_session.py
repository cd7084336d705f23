"""The Evergreen session core beyond its golden transcripts: what it keeps of a client's
message, and what its walks cost on inputs built to make them expensive."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from app.errors import ResourceExhausted
from app.protocols.evergreen.generate import GeneratePlan
from app.protocols.evergreen.session import Limits, Session
from schemas import evergreen_service_pb2 as service_pb
from tests.unit.test_evergreen_transcripts import INFO, plan_action


def new_session(**limits: int) -> Session[GeneratePlan]:
    return Session(Limits(**limits), lambda action: plan_action(action, INFO, lambda name: False))


def message(text: str) -> service_pb.SessionMessage:
    return text_format.Parse(text, service_pb.SessionMessage())


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
