"""Images in a conversation: reading what a client sends inline, and laying each decoded
image into the rendered prompt.

A chat template renders each image as the model's block with one pad token (`start, pad,
end`: `VisionInfo`); `expand_image_blocks` widens each block, in prompt order, to the
pad tokens its vision encoder makes of the image (`DecodedImage.pad_tokens`), the
layout the engine runs (`app.engine.images`). Images are read from bytes the client
sent (base64, or a `data:` URL); a URL elsewhere is refused, not fetched: the server
makes no outbound requests on a client's behalf. One prompt's images are read within one
`ImageBudget` (`PromptImages`): their count and their pixels in all are bounded before
each is decoded.

Decoding is blocking: these run where the conversation is planned, off the event loop.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from app.engine.base import DecodedImage, EngineInfo, ImageBudget, PromptImage, VisionInfo
from app.errors import InvalidRequest


class PromptImages:
    """The images of one prompt, read in the order the body gives them, within one
    `ImageBudget` (a count and a pixel total for the whole prompt: one translation makes
    one of these)."""

    def __init__(self, info: EngineInfo) -> None:
        self._info = info
        self._budget: ImageBudget | None = None

    def read(self, data: str, mime: str, param: str) -> DecodedImage:
        """An image sent as base64 text with its mime type."""
        vision = self._info.require_vision(param)
        if self._budget is None:
            self._budget = ImageBudget(vision)
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(f"{param}: the image data is not base64", param=param) from exc
        try:
            return self._budget.read(raw, mime)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{param}: {exc.message}", param=param) from exc

    def read_url(self, url: str, param: str) -> DecodedImage:
        """An image sent as a URL: a `data:<mime>;base64,<data>` URL only."""
        head, sep, data = url.partition(",")
        if not (head.startswith("data:") and head.endswith(";base64") and sep):
            raise InvalidRequest(
                f"{param}: only inline images are taken (a data:<mime>;base64,... URL); "
                "the server does not fetch URLs",
                param=param,
            )
        return self.read(data, head[len("data:") : -len(";base64")], param)


def expand_image_blocks(
    ids: Sequence[int], images: Sequence[DecodedImage], vision: VisionInfo, param: str
) -> tuple[list[int], tuple[PromptImage, ...]]:
    """`ids` with the i-th `start, pad, end` block widened to `images[i].pad_tokens`
    pads, and each image's place. The rendered prompt must hold exactly one such block
    per image and no other vision token (a template that drops an image, or a client
    text that spells a vision token, is refused)."""
    out: list[int] = []
    placed: list[PromptImage] = []
    i = 0
    while i < len(ids):
        token = ids[i]
        if (
            token == vision.start_token_id
            and i + 2 < len(ids)
            and ids[i + 1] == vision.pad_token_id
            and ids[i + 2] == vision.end_token_id
            and len(placed) < len(images)
        ):
            image = images[len(placed)]
            start = len(out)
            out.extend([vision.start_token_id, *[vision.pad_token_id] * image.pad_tokens])
            out.append(vision.end_token_id)
            placed.append(PromptImage(start, len(out), image))
            i += 3
            continue
        if token in vision.token_ids:
            raise InvalidRequest(
                f"{param}: the prompt holds an image token outside an image's place",
                param=param,
            )
        out.append(token)
        i += 1
    if len(placed) != len(images):
        raise InvalidRequest(
            f"{param}: the chat template placed {len(placed)} of {len(images)} images",
            param=param,
        )
    return out, tuple(placed)
