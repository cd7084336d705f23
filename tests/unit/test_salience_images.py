"""Salience image attachments without an engine: every check the proto asks of
`GenerateRequest.images`, what a session then holds, and that forks and truncations
carry or drop whole images into the next engine request.

A fake `VisionInfo` stands in for the model's image processor: an image's bytes are
`b"img:<N>"` (it becomes N pad tokens), anything else does not decode."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.engine.base import DecodedImage, EngineInfo, ImageBudget, VisionInfo
from app.errors import FailedPrecondition, InvalidRequest, ResourceExhausted
from app.protocols.salience.generate import GenerateCall
from app.protocols.salience.images import check_attachments, decode_attachment
from app.protocols.salience.sessions import Limits, SessionStore
from schemas import salience_pb2 as pb

START, END, PAD = 5, 6, 7


def read_image(data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
    if mime != "image/png":
        raise InvalidRequest(f"the image bytes do not decode as {mime}")
    if not data.startswith(b"img:"):
        raise InvalidRequest("the image bytes do not decode as image/png")
    return DecodedImage(pixels=data, digest=data.hex(), pad_tokens=int(data[4:]))


VISION = VisionInfo(
    start_token_id=START, pad_token_id=PAD, end_token_id=END, max_images=3, read_image=read_image
)
INFO = EngineInfo(
    model_name="vl",
    model_path="/vl",
    max_model_len=256,
    vocab_size=100,
    eos_token_ids=(2,),
    has_chat_template=False,
    max_loras=0,
    vision=VISION,
)


def block(n: int) -> list[int]:
    return [START, *[PAD] * n, END]


def attach(start: int, n: int, data: bytes | None = None, mime: str = "image/png") -> object:
    return pb.ImageAttachment(
        bytes=data if data is not None else f"img:{n}".encode(),
        mime=mime,
        pad_range_start=start,
        pad_range_end=start + n + 2,
    )


def new_store() -> SessionStore:
    return SessionStore("vl", Limits(max_model_len=256, max_images=VISION.max_images), lambda: 0.0)


def generate(
    store: SessionStore,
    sid: str,
    offset: int,
    append: list[int],
    images: Sequence[object] = (),
    truncating: bool = False,
    max_tokens: int = 1,
) -> GenerateCall:
    request = pb.GenerateRequest(
        session_id=sid,
        offset=offset,
        truncating=truncating,
        append_tokens=append,
        max_tokens=max_tokens,
        images=images,
    )
    return GenerateCall(store, request, INFO, "r", decode(request, INFO), claim="r")


def decode(request: pb.GenerateRequest, info: EngineInfo) -> list[DecodedImage]:
    """What the session layer does in a worker thread before the core takes the call."""
    attachments = check_attachments(
        request.images, request.append_tokens, int(request.offset), info
    )
    budget = ImageBudget(VISION)
    return [decode_attachment(a, budget) for a in attachments]


def finish(store: SessionStore, call: GenerateCall) -> None:
    call.end(store)


def test_an_attached_image_reaches_the_engine_request_and_stays_in_the_session() -> None:
    s = new_store()
    sid = s.open("vl").session_id
    tokens = [1, 20, *block(4), 30]
    call = generate(s, sid, 0, tokens, [attach(2, 4)])
    request = call.engine_request
    assert request is not None and request.prompt_token_ids == tokens
    assert [(i.start, i.end, i.image.pad_tokens) for i in request.images] == [(2, 8, 4)]
    assert request.images[0].image.pixels == b"img:4"
    finish(s, call)
    # The next call appends text only: the session's image still goes along.
    call = generate(s, sid, len(tokens), [40])
    assert call.engine_request is not None
    assert [(i.start, i.end) for i in call.engine_request.images] == [(2, 8)]
    finish(s, call)


def test_images_are_sent_in_token_order_whatever_the_request_order() -> None:
    s = new_store()
    sid = s.open("vl").session_id
    tokens = [1, *block(2), 9, *block(3)]
    call = generate(s, sid, 0, tokens, [attach(6, 3), attach(1, 2)])
    assert call.engine_request is not None
    assert [(i.start, i.image.pad_tokens) for i in call.engine_request.images] == [(1, 2), (6, 3)]
    finish(s, call)


@pytest.mark.parametrize(
    ("offset_tokens", "append", "images", "message"),
    [
        # Pad count differs from what the encoder makes of the image: names both.
        ([], [1, *block(5)], [attach(1, 5, b"img:4")], "expected 4, got 5"),
        ([], [1, *block(3)], [attach(1, 3, b"img:4")], "expected 4, got 3"),
        # Range outside this call's append: before the offset, past its end.
        ([1, *block(2)], [9], [attach(1, 2)], "not inside the tokens this call appends"),
        ([], [1, *block(2)], [attach(1, 3)], "not inside the tokens this call appends"),
        # The range is not a block: wrong start, wrong end, a non-pad inside, too short.
        ([], [1, 9, PAD, PAD, END], [attach(1, 2)], "is not a vision block"),
        ([], [1, START, PAD, PAD, 9], [attach(1, 2)], "is not a vision block"),
        ([], [1, START, PAD, 9, PAD, END], [attach(1, 3)], "is not a vision block"),
        (
            [],
            [1, START, END],
            [
                pb.ImageAttachment(
                    bytes=b"img:1", mime="image/png", pad_range_start=1, pad_range_end=3
                )
            ],
            "is not a vision block",
        ),
        # Overlapping declarations.
        ([], [1, *block(4)], [attach(1, 4), attach(2, 2)], "overlap"),
        # A block (or any vision token) without its attachment.
        ([], [1, *block(2), *block(2)], [attach(1, 2)], "outside every block"),
        ([], [1, PAD, 3], [], "outside every block"),
        ([], [1, END], [], "outside every block"),
        # Bytes that do not decode, a mime that does not match.
        ([], [1, *block(2)], [attach(1, 2, b"\x89PNG garbage")], "do not decode"),
        ([], [1, *block(2)], [attach(1, 2, mime="image/jpeg")], "do not decode as image/jpeg"),
    ],
)
def test_bad_attachments_are_invalid_argument_and_touch_nothing(
    offset_tokens: list[int], append: list[int], images: list[object], message: str
) -> None:
    s = new_store()
    sid = s.open("vl").session_id
    if offset_tokens:
        finish(s, generate(s, sid, 0, offset_tokens, [attach(1, 2)], max_tokens=0))
    before = s.get(sid).tokens.tolist(), list(s.get(sid).images)
    with pytest.raises(InvalidRequest, match=message) as caught:
        generate(s, sid, len(offset_tokens), append, images)
    assert caught.value.grpc_status == "INVALID_ARGUMENT"
    session = s.get(sid)
    assert (session.tokens.tolist(), session.images) == before and not session.busy


def test_the_error_names_the_attachment() -> None:
    s = new_store()
    sid = s.open("vl").session_id
    with pytest.raises(InvalidRequest, match=r"images\[1\]: .*expected 2, got 3"):
        generate(s, sid, 0, [*block(2), *block(3)], [attach(0, 2), attach(4, 3, b"img:2")])


def test_a_text_only_model_refuses_images_naming_the_reason() -> None:
    s = SessionStore("t", Limits(max_model_len=64), lambda: 0.0)
    sid = s.open("t").session_id
    info = EngineInfo("t", "/t", 64, 100, (2,), False, 0)
    request = pb.GenerateRequest(session_id=sid, append_tokens=[1, 2], max_tokens=1)
    request.images.append(attach(0, 1))
    with pytest.raises(InvalidRequest, match="takes no images"):
        GenerateCall(s, request, info, "r")
    # Pad-looking ids are ordinary tokens to a text model.
    call = GenerateCall(s, pb.GenerateRequest(session_id=sid, append_tokens=[PAD]), info, "r")
    call.end(s)


def test_a_session_holds_at_most_the_engines_images_per_prompt() -> None:
    s = new_store()  # max_images 3
    sid = s.open("vl").session_id
    finish(s, generate(s, sid, 0, [*block(1), *block(1)], [attach(0, 1), attach(3, 1)]))
    with pytest.raises(ResourceExhausted, match="at most 3"):
        generate(s, sid, 6, [*block(1), *block(1)], [attach(6, 1), attach(9, 1)])
    assert len(s.get(sid).images) == 2 and not s.get(sid).busy
    # Truncating one image away makes room.
    call = generate(
        s, sid, 3, [*block(1), *block(1)], [attach(3, 1), attach(6, 1)], truncating=True
    )
    assert call.engine_request is not None and len(call.engine_request.images) == 3
    finish(s, call)


def test_forks_and_truncations_never_split_a_block_and_carry_whole_images() -> None:
    s = new_store()
    sid = s.open("vl").session_id
    tokens = [1, 20, *block(4), 30, 31]  # the block is [2, 8)
    finish(s, generate(s, sid, 0, tokens, [attach(2, 4)], max_tokens=0))
    for inside in range(3, 8):
        with pytest.raises(FailedPrecondition, match="inside an image block"):
            s.fork(sid, inside)
        with pytest.raises(FailedPrecondition, match="split an image block"):
            generate(s, sid, inside, [], truncating=True)
    assert len(s.get(sid).images) == 1 and not s.get(sid).busy
    # A fork at the block's end keeps the image, and its next Generate sends it.
    child = s.fork(sid, 8).session_id
    call = generate(s, child, 8, [40])
    assert call.engine_request is not None
    assert call.engine_request.prompt_token_ids == [*tokens[:8], 40]
    assert [(i.start, i.end, i.image.digest) for i in call.engine_request.images] == [
        (2, 8, b"img:4".hex())
    ]
    finish(s, call)
    # A fork at the block's start drops it; so does truncating there.
    bare = s.fork(sid, 2).session_id
    call = generate(s, bare, 2, [40])
    assert call.engine_request is not None and call.engine_request.images == ()
    finish(s, call)
    call = generate(s, sid, 2, [41], truncating=True)
    assert call.engine_request is not None and call.engine_request.images == ()
    call.abandon(s)  # failed before decoding: the image comes back
    assert [(i.start, i.end) for i in s.get(sid).images] == [(2, 8)]
    assert s.get(sid).tokens.tolist() == tokens
