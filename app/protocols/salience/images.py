"""Salience image attachments: the checks `GenerateRequest.images` must pass, as the proto
states them, before a Generate touches its session.

Sans-IO, in three steps, so that decoding (the costly, blocking one) runs where the
caller chooses, off the event loop (`app.sessions.salience` runs it in a worker thread):

1. `check_attachments`: everything the request says without the pixels, in token order;
2. `decode_attachment`: one image decoded and measured by the engine's
   `VisionInfo.read_image` (blocking);
3. `place_images`: each decoded image into its block.

Every failure is INVALID_ARGUMENT (`InvalidRequest`) naming the attachment, and nothing
is applied:

- a model without images (`EngineInfo.vision` is None) refuses any attachment;
- each attachment's range [pad_range_start, pad_range_end) lies inside the tokens this
  call appends, [offset, offset + len(append_tokens)); ranges do not overlap;
- each range is a whole vision block: the vision start token, N image pad tokens, the
  vision end token, where N is what the vision encoder makes of the attached image;
- every vision token appended (start, pad or end) belongs to a declared block: an
  unpaired block would reach the engine as an image without pixels;
- the bytes decode as the declared mime type (checked last: it is the costly step).

Blocks are returned in token order, which is the order the engine takes images in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from app.engine.base import DecodedImage, EngineInfo, ImageBudget, PromptImage, VisionInfo
from app.errors import InvalidRequest
from schemas import salience_pb2 as pb


@dataclass(frozen=True, slots=True)
class Attachment:
    """An attachment that passed every check but decoding: its block and its bytes."""

    index: int  # in the request's `images`
    start: int
    end: int
    data: bytes
    mime: str


def check_attachments(
    attachments: Sequence[pb.ImageAttachment],
    append: Sequence[int],
    offset: int,
    info: EngineInfo,
) -> list[Attachment]:
    """Check one Generate's attachments against its append (which starts at session
    position `offset`); the images to decode, in token order."""
    if info.vision is None and not attachments:
        return []  # a text-only model: no block to place, no vision token to find
    vision = info.require_vision("images")
    end_of_append = offset + len(append)
    ranges: list[tuple[int, int, int]] = []  # (start, end, index in the request)
    for i, image in enumerate(attachments):
        start, end = int(image.pad_range_start), int(image.pad_range_end)
        if not offset <= start < end <= end_of_append:
            raise InvalidRequest(
                f"images[{i}]: range [{start}, {end}) is not inside the tokens this call "
                f"appends, [{offset}, {end_of_append})"
            )
        ranges.append((start, end, i))
    ranges.sort()
    for (_, end_a, a), (start_b, _, b) in pairwise(ranges):
        if start_b < end_a:
            raise InvalidRequest(f"images[{a}] and images[{b}] overlap")
    for start, end, i in ranges:
        # Relative to the append from here on.
        if not _is_block(append[start - offset : end - offset], vision):
            raise InvalidRequest(
                f"images[{i}]: [{start}, {end}) is not a vision block: the vision start "
                f"token {vision.start_token_id}, image pad tokens {vision.pad_token_id}, "
                f"the vision end token {vision.end_token_id}"
            )
    stray = _stray_vision_token(append, [(s - offset, e - offset) for s, e, _ in ranges], vision)
    if stray is not None:
        raise InvalidRequest(
            f"append_tokens: position {offset + stray} holds the vision token "
            f"{append[stray]} outside every block declared in images (each block needs "
            "its ImageAttachment)"
        )
    return [
        Attachment(i, start, end, attachments[i].bytes, attachments[i].mime)
        for start, end, i in ranges
    ]


def decode_attachment(attachment: Attachment, budget: ImageBudget) -> DecodedImage:
    """Decode and measure one image within its prompt's `budget`. Blocking (it decodes
    every pixel): call it off the event loop."""
    try:
        return budget.read(attachment.data, attachment.mime)
    except InvalidRequest as exc:
        raise InvalidRequest(f"images[{attachment.index}]: {exc.message}") from exc


def place_images(
    attachments: Sequence[Attachment], decoded: Sequence[DecodedImage]
) -> list[PromptImage]:
    """Each decoded image in its block, once its pad count is the encoder's."""
    blocks = []
    for attachment, image in zip(attachments, decoded, strict=True):
        start, end, i = attachment.start, attachment.end, attachment.index
        pads = end - start - 2
        if pads != image.pad_tokens:
            raise InvalidRequest(
                f"images[{i}]: the block [{start}, {end}) holds {pads} image pad tokens; "
                f"the vision encoder makes {image.pad_tokens} of this image (expected "
                f"{image.pad_tokens}, got {pads})"
            )
        blocks.append(PromptImage(start, end, image))
    return blocks


def _is_block(tokens: Sequence[int], vision: VisionInfo) -> bool:
    """start, at least one pad, end."""
    return (
        len(tokens) >= 3
        and tokens[0] == vision.start_token_id
        and tokens[-1] == vision.end_token_id
        and all(t == vision.pad_token_id for t in tokens[1:-1])
    )


def _stray_vision_token(
    tokens: Sequence[int], blocks: list[tuple[int, int]], vision: VisionInfo
) -> int | None:
    """The first index of a vision token outside `blocks` (sorted, disjoint), or None."""
    vision_ids = vision.token_ids
    b = 0
    for position, token in enumerate(tokens):
        if token not in vision_ids:
            continue
        while b < len(blocks) and blocks[b][1] <= position:
            b += 1
        if b == len(blocks) or position < blocks[b][0]:
            return position
    return None
