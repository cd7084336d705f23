"""The Salience session core without an engine: (offset, truncating), fork boundaries,
busy sessions, TTL on a fake clock, limits, and Generate's event transcript."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.engine.base import (
    DecodedImage,
    EngineInfo,
    PromptImage,
    ReadoutManifest,
    TokenEvent,
    TokenLogprob,
)
from app.errors import (
    Aborted,
    ContextLengthExceeded,
    FailedPrecondition,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    ResourceExhausted,
)
from app.protocols.salience.generate import GenerateCall
from app.protocols.salience.sessions import Limits, Session, SessionStore
from schemas import salience_pb2 as pb
from tests.seeds import published

ROOT = Path(__file__).resolve().parents[2]
Finish = pb.GenerateDone.FinishReason


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(clock: Clock | None = None, **limits: Any) -> SessionStore:
    return SessionStore("m", Limits(**{"max_model_len": 64, **limits}), clock or Clock())


def start(
    s: SessionStore,
    sid: str,
    offset: int,
    append: list[int],
    truncating: bool = False,
    max_tokens: int = 0,
    images: list[PromptImage] | None = None,
) -> Session:
    """A Generate checked and applied: the session is running it."""
    mutation = s.check_generate(
        sid,
        offset=offset,
        truncating=truncating,
        append=append,
        max_tokens=max_tokens,
        images=images or [],
    )
    return s.begin_generate(mutation, "claim")


def end(s: SessionStore, session: Session, *, rollback: bool = False) -> None:
    """The running Generate ends (decoding nothing more)."""
    s.end_generate(session.session_id, session.claim, [], rollback=rollback)


def done(s: SessionStore, call: GenerateCall, *, cancelled: bool = False) -> list[pb.GenerateEvent]:
    """A Generate ends on its session; its closing events."""
    call.end(s)
    return call.closing(cancelled=cancelled)


def begin(
    s: SessionStore,
    sid: str,
    offset: int,
    append: list[int],
    truncating: bool = False,
    max_tokens: int = 0,
) -> None:
    end(s, start(s, sid, offset, append, truncating, max_tokens))


def test_offset_must_match_unless_truncating() -> None:
    s = store()
    sid = s.open("m").session_id
    begin(s, sid, 0, [1, 2, 3])
    with pytest.raises(FailedPrecondition):
        begin(s, sid, 2, [9])  # behind, not truncating: drift
    with pytest.raises(FailedPrecondition):
        begin(s, sid, 4, [9], truncating=True)  # ahead of the server: drift either way
    begin(s, sid, 1, [7, 8], truncating=True)  # rewinds to 1, then appends
    assert s.get(sid).tokens.tolist() == [1, 7, 8]
    begin(s, sid, 3, [], truncating=True)  # truncating at the exact length is a no-op
    assert s.get(sid).tokens.tolist() == [1, 7, 8]


def test_fork_inherits_prefix_and_never_splits_an_image() -> None:
    s = store()
    sid = s.open("m").session_id
    session = start(
        s, sid, 0, [1, 2, 3, 4, 5, 6], images=[PromptImage(2, 5, DecodedImage(None, "d", 1))]
    )
    end(s, session)
    child = s.fork(sid, 2)
    assert child.tokens.tolist() == [1, 2] and child.images == []
    whole = s.fork(sid, 5)
    assert len(whole.images) == 1
    for inside in (3, 4):
        with pytest.raises(FailedPrecondition):
            s.fork(sid, inside)
    with pytest.raises(FailedPrecondition):
        s.fork(sid, 7)
    with pytest.raises(FailedPrecondition):
        begin(s, sid, 3, [], truncating=True)  # truncating into the image block


def test_busy_session_and_idempotent_close() -> None:
    s = store()
    sid = s.open("m").session_id
    session = start(s, sid, 0, [1], max_tokens=1)
    with pytest.raises(Aborted, match="busy"):
        begin(s, sid, 1, [2])
    end(s, session)
    begin(s, sid, 1, [2])
    s.close(sid)
    s.close(sid)
    with pytest.raises(NotFound):
        s.get(sid)


def test_ttl_expires_idle_sessions_but_not_busy_ones() -> None:
    clock = Clock()
    s = store(clock, ttl_s=60)
    idle = s.open("m").session_id
    busy_id = s.open("m").session_id
    kept = s.open("m").session_id
    session = start(s, busy_id, 0, [1], max_tokens=1)
    clock.now += 50
    begin(s, kept, 0, [])  # a no-op Generate refreshes the TTL
    clock.now += 20
    assert s.expire() == [idle]
    assert s.get(busy_id) is session and s.get(kept).session_id == kept
    with pytest.raises(NotFound):
        s.get(idle)


def test_limits() -> None:
    s = store(max_sessions=2, max_session_tokens=5)
    with pytest.raises(ModelNotFound):
        s.open("other")
    first = s.open("m").session_id
    second = s.open("m").session_id
    # At the cap an open evicts the least recently used idle session (the rules of
    # eviction are test_salience_lifecycle's); with every session running, it refuses.
    third = s.open("m").session_id
    with pytest.raises(NotFound):
        s.get(first)
    running = [start(s, sid, 0, [1], max_tokens=1) for sid in (second, third)]
    with pytest.raises(ResourceExhausted, match="too many sessions"):
        s.open("m")
    for session in running:
        end(s, session)
    with pytest.raises(ResourceExhausted):
        begin(s, second, 1, [1] * 5)


INFO = EngineInfo(
    model_name="m",
    model_path="/m",
    max_model_len=64,
    vocab_size=100,
    eos_token_ids=(0,),
    has_chat_template=False,
    max_loras=0,
    readout=ReadoutManifest(concepts=("a",), layers=(0,), hidden_size=4),
)


def lp(token: int, value: float) -> TokenLogprob:
    return TokenLogprob(token_id=token, logprob=value, rank=1, top={token: value, 99: -9.0})


def test_generate_transcript_with_logprobs_and_held_readouts() -> None:
    s = store()
    sid = s.open("m").session_id
    request = pb.GenerateRequest(
        session_id=sid, append_tokens=[5, 6, 7], offset=0, max_tokens=2, logprob_top_k=1
    )
    request.logprobs_ranges.add(start=1, end=4)
    request.readout_ranges.add(start=3, end=5)
    call = GenerateCall(s, request, INFO, "r")
    engine = call.engine_request
    assert engine is not None and engine.prompt_token_ids == [5, 6, 7]
    assert engine.sampling.prompt_logprobs == 1 and engine.sampling.logprobs == 1
    assert engine.sampling.temperature == 1.0 and engine.readout_ranges == ((3, 5),)
    r3 = bytes(4)  # one float: 0.0
    first = call.on_event(
        TokenEvent(
            token_ids=[8],
            text="",
            logprobs=[lp(8, -0.5)],
            prompt_token_ids=[5, 6, 7],
            prompt_logprobs=[None, lp(6, -1.0), lp(7, -2.0)],
        )
    )
    # Prefill positions 1, 2 (logprobs); 3 is decode, covered by both, so held.
    assert [(e.token.position, e.token.is_prefill, e.token.sampled_logprob) for e in first] == [
        (1, True, -1.0),
        (2, True, -2.0),
    ]
    assert [(t.id, t.logprob) for t in first[0].token.logprobs] == [(6, -1.0), (99, -9.0)]
    second = call.on_event(
        TokenEvent(
            token_ids=[9], text="", logprobs=[lp(9, -0.25)], finish_reason="stop", readouts={3: r3}
        )
    )
    assert [(e.token.position, list(e.token.readout)) for e in second] == [(3, [0.0])]
    assert second[0].token.has_sampled_logprob and second[0].token.sampled_logprob == -0.5
    closing = done(s, call)
    assert closing[0].token.position == 4 and list(closing[0].token.readout) == []
    assert closing[1].done == pb.GenerateDone(
        prompt_tokens=3, completion_tokens=2, total_tokens=5, finish_reason=Finish.FINISH_REASON_EOS
    )
    assert s.get(sid).tokens.tolist() == [5, 6, 7, 8, 9] and not s.get(sid).busy


def test_no_op_generate_needs_no_engine_and_cancel_is_reported() -> None:
    s = store()
    sid = s.open("m").session_id
    call = GenerateCall(s, pb.GenerateRequest(session_id=sid), INFO, "r")
    assert call.engine_request is None
    assert done(s, call)[0].done.finish_reason == Finish.FINISH_REASON_LENGTH
    request = pb.GenerateRequest(session_id=sid, append_tokens=[1], max_tokens=5)
    call = GenerateCall(s, request, INFO, "r2")
    call.on_event(TokenEvent(token_ids=[2], text=""))
    last = done(s, call, cancelled=True)[-1].done
    assert last.finish_reason == Finish.FINISH_REASON_CANCELLED and last.completion_tokens == 1


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (
            {"append_tokens": [1], "max_tokens": 1, "images": [pb.ImageAttachment(bytes=b"x")]},
            InvalidRequest,
        ),
        ({"max_tokens": 1}, InvalidRequest),  # empty session
        (
            {"append_tokens": [1], "logprobs_ranges": [pb.PositionRange(start=3, end=1)]},
            InvalidRequest,
        ),
        ({"session_id": "nope"}, NotFound),
    ],
)
def test_generate_rejections_leave_the_session_free(fields: dict[str, object], error: type) -> None:
    s = store()
    sid = s.open("m").session_id
    request = pb.GenerateRequest(session_id=sid)
    for key, value in fields.items():
        if isinstance(value, list):
            getattr(request, key).extend(value)
        else:
            setattr(request, key, value)
    with pytest.raises(error):
        GenerateCall(s, request, INFO, "r")
    assert not s.get(sid).busy


def test_generated_protobuf_matches_the_script(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "generate"), str(tmp_path)], check=True, cwd=ROOT)
    names = sorted(p.name for p in (ROOT / "schemas").glob("*_pb2.py"))
    assert names == sorted(p.name for p in (tmp_path / "schemas").glob("*_pb2.py"))
    _, mismatch, errors = filecmp.cmpfiles(
        ROOT / "schemas", tmp_path / "schemas", names, shallow=False
    )
    assert (mismatch, errors) == ([], []), "run scripts/generate and commit the result"


def test_schema_is_the_published_one() -> None:
    assert (ROOT / "schemas" / "salience.proto").read_bytes() == published(
        "salience.proto"
    ).read_bytes()


def test_scoring_needs_room_for_the_token_the_engine_samples() -> None:
    s = store()  # context of 64
    sid = s.open("m").session_id
    scoring = pb.GenerateRequest(session_id=sid, append_tokens=[1] * 64)
    scoring.logprobs_ranges.add(start=0, end=64)
    with pytest.raises(ContextLengthExceeded) as refused:
        GenerateCall(s, scoring, INFO, "r")
    assert refused.value.grpc_status == "RESOURCE_EXHAUSTED"
    assert len(s.get(sid).tokens) == 0
    # Without ranges, max_tokens 0 runs no engine: the full context is fine.
    call = GenerateCall(s, pb.GenerateRequest(session_id=sid, append_tokens=[1] * 64), INFO, "r")
    assert call.engine_request is None
    done(s, call)
    assert len(s.get(sid).tokens) == 64


def test_rollback_restores_a_truncated_tail_and_its_images() -> None:
    s = store()
    sid = s.open("m").session_id
    images = [PromptImage(3, 6, DecodedImage(None, "d", 1))]
    session = start(s, sid, 0, list(range(1, 9)), images=images)
    end(s, session)
    session = start(s, sid, 2, [50], truncating=True, max_tokens=1)
    assert session.tokens.tolist() == [1, 2, 50] and session.images == []
    end(s, session, rollback=True)
    assert session.tokens.tolist() == list(range(1, 9)) and session.images == images
    assert not session.busy


def test_an_empty_session_refused_after_truncating_keeps_its_tokens() -> None:
    s = store()
    sid = s.open("m").session_id
    begin(s, sid, 0, [1, 2, 3])
    request = pb.GenerateRequest(session_id=sid, offset=0, truncating=True, max_tokens=1)
    with pytest.raises(InvalidRequest, match="holds no tokens"):
        GenerateCall(s, request, INFO, "r")
    assert s.get(sid).tokens.tolist() == [1, 2, 3]
