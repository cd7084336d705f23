"""The Evergreen session's lifecycle table itself: every (phase, cause) pair has an entry,
each entry is exercised by a scenario that puts a session in the phase and applies the
cause, and random cause streams keep the invariants (the first failure is the one
reported; leaving the live phases drops the nodes; once over, always over). And the
abort on the wire: the ABORT message, close codes and reasons."""

from __future__ import annotations

import pytest
from google.protobuf import json_format, struct_pb2, text_format
from hypothesis import given
from hypothesis import strategies as st

from app.errors import (
    Aborted,
    ContextLengthExceeded,
    EngineDead,
    FailedPrecondition,
    InternalError,
    InvalidRequest,
    NotFound,
    ResourceExhausted,
    SwitchboardError,
    Unauthenticated,
)
from app.protocols.evergreen.generate import GeneratePlan
from app.protocols.evergreen.lifecycle import (
    LIFECYCLE,
    Cause,
    Lifecycle,
    Phase,
    abort_message,
    close_code,
    close_reason,
)
from app.protocols.evergreen.session import Limits, NodeState, Session
from schemas import evergreen_service_pb2 as service_pb
from tests.evergreen_frames import planner

P, C = Phase, Cause
FIRST = InvalidRequest("the first failure")
# The causes that put a fresh session in each phase.
PATHS: dict[Phase, list[Cause]] = {
    P.OPEN: [],
    P.DRAINING: [C.INPUT_ENDED],
    P.FAILING: [C.FAILED],
    P.ABORTED: [C.FAILED, C.STOPPED],
    P.ENDED: [C.CLIENT_LEFT],
}
LEAF = (
    'node_fragments { id: "n" continued: true '
    'chunk_fragment { metadata { mimetype: "text/plain" } data: "a" } }'
)


def new_lifecycle() -> Lifecycle[GeneratePlan]:
    session: Session[GeneratePlan] = Session(Limits(), planner())
    lifecycle = Lifecycle(session)
    lifecycle.receive(text_format.Parse(LEAF, service_pb.SessionMessage()))
    assert session.state_of("n") is NodeState.OPEN
    return lifecycle


def put_in(phase: Phase) -> Lifecycle[GeneratePlan]:
    lifecycle = new_lifecycle()
    for cause in PATHS[phase]:
        lifecycle.step(cause, FIRST if cause is C.FAILED else None)
    assert lifecycle.phase is phase
    return lifecycle


def test_the_table_is_complete() -> None:
    assert set(LIFECYCLE) == {(phase, cause) for phase in Phase for cause in Cause}


@pytest.mark.parametrize("key", list(LIFECYCLE), ids=lambda k: f"{k[0].value}-{k[1].value}")
def test_entry(key: tuple[Phase, Cause]) -> None:
    phase, cause = key
    lifecycle = put_in(phase)
    later = Aborted("a later failure")
    changed = lifecycle.step(cause, later if cause is C.FAILED else None)
    after = LIFECYCLE[key]
    assert lifecycle.phase is after and changed is (after is not phase)
    live = after in (P.OPEN, P.DRAINING)
    assert lifecycle.starts_actions is live
    assert lifecycle.takes_messages is (after is P.OPEN)
    # The nodes are dropped the moment the session stops being live.
    assert (lifecycle.session.state_of("n") is NodeState.OPEN) is live
    assert (lifecycle.session.ended is None) is live
    # Only an aborted session has something to tell, and it is its first failure.
    assert lifecycle.abort is (FIRST if after is P.ABORTED else None)


def test_a_failure_then_stop_reports_the_failure_a_departure_reports_nothing() -> None:
    lifecycle = new_lifecycle()
    assert lifecycle.fail(FIRST) and not lifecycle.fail(Aborted("second"))
    lifecycle.step(C.STOPPED)
    assert lifecycle.phase is P.ABORTED and lifecycle.abort is FIRST
    gone = new_lifecycle()
    gone.fail(FIRST)
    gone.step(C.CLIENT_LEFT)
    gone.step(C.STOPPED)
    assert gone.phase is P.ENDED and gone.abort is None


def test_a_broken_rule_fails_the_session_and_later_messages_are_dropped() -> None:
    lifecycle = new_lifecycle()
    bad = 'node_fragments { id: "n" seq: 1 child_ids: "c" }'  # a leaf given children
    assert lifecycle.receive(text_format.Parse(bad, service_pb.SessionMessage())) == []
    assert lifecycle.phase is P.FAILING
    assert lifecycle.receive(text_format.Parse(LEAF, service_pb.SessionMessage())) == []
    lifecycle.step(C.STOPPED)
    assert lifecycle.abort is not None and lifecycle.abort.evergreen_reason == "INVALID_ARGUMENT"


def test_draining_ends_when_idle_and_releases_nothing_after() -> None:
    lifecycle = put_in(P.DRAINING)
    lifecycle.step(C.IDLE)
    assert lifecycle.phase is P.ENDED and lifecycle.abort is None
    assert lifecycle.finish(0) == []  # an action finishing late starts nothing


@given(st.lists(st.sampled_from(list(Cause)), max_size=12))
def test_random_cause_streams_keep_the_invariants(causes: list[Cause]) -> None:
    lifecycle = new_lifecycle()
    failures: list[SwitchboardError] = []
    over = False
    for i, cause in enumerate(causes):
        failure = InvalidRequest(f"failure {i}") if cause is C.FAILED else None
        if failure is not None:
            failures.append(failure)
        lifecycle.step(cause, failure)
        live = lifecycle.phase in (P.OPEN, P.DRAINING)
        assert not (over and live), "a session that was over came back"
        over = over or not live
        assert (lifecycle.session.ended is None) is live
    if lifecycle.abort is not None:
        assert lifecycle.abort is failures[0]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequest("x"), 4003),
        (NotFound("x"), 4005),
        (ContextLengthExceeded("x"), 4008),
        (ResourceExhausted("x"), 4008),
        (FailedPrecondition("x"), 4009),
        (Aborted("x"), 4010),
        (InternalError("abc"), 4013),
        (EngineDead("x"), 4014),
        (Unauthenticated("x"), 4016),
    ],
)
def test_close_codes(error: SwitchboardError, code: int) -> None:
    assert close_code(error) == code


def test_the_abort_message_and_a_close_reason_cut_on_a_character() -> None:
    error = InvalidRequest("é" * 100)  # 200 bytes
    (action,) = abort_message(error).actions
    status = struct_pb2.Struct()
    assert action.name == "ABORT" and action.configs[0].Unpack(status)
    assert json_format.MessageToDict(status) == {"code": "INVALID_ARGUMENT", "message": "é" * 100}
    reason = close_reason(error)
    assert reason == "é" * 61 and len(reason.encode()) == 122
