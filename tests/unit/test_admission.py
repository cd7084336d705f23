"""The one admission bound (sans-IO, on a fake clock)."""

from __future__ import annotations

import pytest

from app.admission import LANE_PRIORITY, Admission, ProtocolName
from app.errors import Overloaded


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_unbounded_admits_everything() -> None:
    admission = Admission(None, None)
    tickets = [admission.admit(ProtocolName.OPENAI) for _ in range(1000)]
    assert admission.in_flight == 1000
    for ticket in tickets:
        ticket.release()
    assert admission.in_flight == 0 and not admission.queued()


def test_the_request_bound_counts_queued_not_running() -> None:
    admission = Admission(2, None)
    first = admission.admit(ProtocolName.OPENAI)
    admission.admit(ProtocolName.SALIENCE)
    with pytest.raises(Overloaded) as refused:
        admission.admit(ProtocolName.GRAPHPIPE)
    assert refused.value.http_status == 503 and refused.value.grpc_status == "UNAVAILABLE"
    assert refused.value.retry_after_s >= 1
    first.running()  # prefill done: no longer waiting
    admission.admit(ProtocolName.GRAPHPIPE)
    assert admission.queued() == {"salience": 1, "graphpipe": 1}
    assert admission.admitted == {"openai": 1, "salience": 1, "graphpipe": 1}
    assert admission.refused == {"graphpipe": 1}


def test_the_token_bound_admits_one_request_alone_however_long() -> None:
    admission = Admission(None, 100)
    lone = admission.admit(ProtocolName.OPENAI, tokens=5000)  # nothing waits ahead of it
    with pytest.raises(Overloaded):
        admission.admit(ProtocolName.OPENAI, tokens=1)
    lone.release()
    admission.admit(ProtocolName.OPENAI, tokens=60)
    admission.admit(ProtocolName.OPENAI, tokens=40)
    with pytest.raises(Overloaded):
        admission.admit(ProtocolName.OPENAI, tokens=1)


def test_measured_tokens_replace_the_upper_bound() -> None:
    admission = Admission(None, 100)
    ticket = admission.admit(ProtocolName.OPENAI, tokens=90)
    ticket.measured(10)
    assert admission.queued_tokens == 10
    admission.admit(ProtocolName.OPENAI, tokens=90)
    ticket.running()
    ticket.measured(50)  # no longer queued: the queue does not change
    assert admission.queued_tokens == 90


def test_release_is_once_whatever_the_state() -> None:
    admission = Admission(1, None)
    ticket = admission.admit(ProtocolName.EVERGREEN)
    ticket.release()
    ticket.release()
    ticket.running()
    assert admission.in_flight == 0 and admission.queued_tokens == 0
    admission.admit(ProtocolName.EVERGREEN)  # the slot is free again


def test_higher_priority_is_not_refused_behind_lower_priority_waiters() -> None:
    admission = Admission(2, None)
    admission.admit(ProtocolName.OPENAI, priority=5)
    admission.admit(ProtocolName.OPENAI, priority=5)
    with pytest.raises(Overloaded):
        admission.admit(ProtocolName.OPENAI, priority=5)
    with pytest.raises(Overloaded):
        admission.admit(ProtocolName.OPENAI, priority=7)
    assert not admission.saturated()  # readiness: a default-priority request gets in
    # Lower value = higher priority: it waits behind none of them.
    admission.admit(ProtocolName.SALIENCE, priority=0)
    admission.admit(ProtocolName.SALIENCE, priority=0)
    with pytest.raises(Overloaded):
        admission.admit(ProtocolName.SALIENCE, priority=0)
    assert admission.saturated()


def _refused_after_waits(protocol: ProtocolName, priority: int, wait_s: float) -> Overloaded:
    """The refusal of a bound of one, after 30 tickets of `protocol` at `priority` each
    waited `wait_s` in the queue."""
    clock = Clock()
    admission = Admission(1, None, clock=clock)
    for _ in range(30):
        ticket = admission.admit(protocol, priority=priority)
        clock.now += wait_s
        ticket.running()
        ticket.release()
    admission.admit(ProtocolName.OPENAI)
    with pytest.raises(Overloaded) as refused:
        admission.admit(ProtocolName.OPENAI)
    return refused.value


def test_the_retry_hint_follows_the_queue_wait() -> None:
    refused = _refused_after_waits(ProtocolName.OPENAI, 0, 4.0)
    assert refused.retry_after_s == 4
    assert "retry after 4 s" in refused.message


def test_the_retry_hint_leaves_out_the_batch_lanes_waits() -> None:
    # Batch requests wait long in the engine's queue, by design.
    refused = _refused_after_waits(ProtocolName.BATCH, LANE_PRIORITY, 60.0)
    assert refused.retry_after_s == 1


def test_a_call_is_admitted_whole_or_not_at_all() -> None:
    admission = Admission(3, None)
    admission.admit(ProtocolName.OPENAI)
    with pytest.raises(Overloaded):
        admission.admit_all(ProtocolName.OPENAI, [10, 10, 10])
    assert admission.in_flight == 1 and admission.queued_tokens == 0
    assert admission.admitted == {"openai": 1} and admission.refused == {"openai": 3}
    with admission.admit_all(ProtocolName.GRAPHPIPE, [10, 10]) as tickets:
        assert len(tickets) == 2 and admission.queued_tokens == 20
        tickets[0].running()
    assert admission.in_flight == 1 and admission.queued_tokens == 0


def test_a_closed_admission_refuses_everything_and_cut_marks_what_is_in_flight() -> None:
    admission = Admission(None, None)
    queued = admission.admit(ProtocolName.EVERGREEN)
    running = admission.admit(ProtocolName.SALIENCE)
    running.request_id = "r1"
    running.running()
    admission.close()
    with pytest.raises(Overloaded) as refused:
        admission.admit(ProtocolName.OPENAI, priority=-10)
    assert "shutting down" in refused.value.message and refused.value.retry_after_s >= 1
    assert admission.cut() == ["r1"]
    assert queued.cut and running.cut
    assert admission.refused == {"openai": 1}


def test_a_unit_counts_at_most_the_engines_context() -> None:
    """A prompt bound past the context (a 16 MiB prompt, refused once measured) counts as
    the context: it does not take every queued token's place from the others meanwhile."""
    admission = Admission(None, 100)
    admission.max_unit_tokens = 50
    huge = admission.admit(ProtocolName.OPENAI, tokens=16 << 20)
    assert huge.tokens == 50 and admission.queued_tokens == 50
    admission.admit(ProtocolName.OPENAI, tokens=50)
    with pytest.raises(Overloaded):
        admission.admit(ProtocolName.OPENAI, tokens=1)
