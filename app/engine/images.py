"""Images for a vision-language model: reading them, and laying them into a vLLM prompt.

`ImageReader` turns (encoded bytes, mime type) into a `DecodedImage`:
- only the one format the mime type names is tried, so PIL never guesses (some of its
  formats run external programs) and bytes of another format fail as "not image/png";
- the pixel count is checked from the image's header before a pixel is decoded: an
  image past `max_pixels` (PIL's decompression-bomb bound, `Image.MAX_IMAGE_PIXELS`, by
  default; less where a call's `max_pixels` says so: what its prompt's other images left,
  `app.protocols.conversation.images.ImageBudget`) is refused without decoding it, so a
  small file that inflates to gigabytes costs nothing;
- the whole image is decoded here, so a truncated file fails the request that sent it,
  not an engine step. Decoding is blocking: callers run the reader off the event loop
  (`app.sessions.salience` uses a worker thread), and nothing here touches process-wide
  state (no warning filters), so readers may run in several threads at once;
- N, the image's pad tokens, is the model's own image processor's patch count for the
  image's size (`get_number_of_image_patches`) divided by its `merge_size**2`: one pad
  token per feature the vision encoder makes after merging patches. vLLM sizes the
  placeholder with its own arithmetic (`engine_count`), which for PaddleOCR-VL disagrees
  with the processor on extreme aspect ratios (a 600x20 image: 21 features, 0 pads) and
  then fails the request inside the engine; such an image is refused here instead.

`collapse_blocks` prepares a token-id prompt with images for vLLM. vLLM 0.32 always
expands each image's placeholder itself (its multimodal processor replaces the first pad
token it finds with N pads per image), so a prompt whose blocks are already expanded must
reach it with each pad run collapsed to one pad; vLLM then expands it back to exactly the
caller's tokens (`app.engine.vllm` checks the echo). Each image goes with its digest as
vLLM's multimodal UUID: vLLM's processor cache and the prefix cache's block hashes key
on it, so a session that sends its images with every call reuses their processed pixels,
and equal tokens with a different image never share KV blocks past the image.

Invariant of a prompt with images: every pad token belongs to exactly one block (a stray
one would be taken for another image's placeholder).
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PIL import Image

from app.engine.base import DecodedImage, PromptImage, VisionInfo
from app.errors import InvalidRequest

# The mime types taken, and the one PIL format each names.
FORMATS = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
    "image/bmp": "BMP",
}


def _normalise_mime(mime: str) -> str:
    return mime.split(";", 1)[0].strip().lower()


class ImageReader:
    """Decodes and measures images with the model's image processor."""

    def __init__(
        self,
        image_processor: Any,
        processor_kwargs: Mapping[str, object],
        engine_count: Callable[[int, int], int],
        max_pixels: int | None = None,
    ) -> None:
        self._processor = image_processor
        self._max_pixels = max_pixels
        self._engine_count = engine_count
        # vLLM's --mm-processor-kwargs (e.g. max_pixels) change what it expands an image
        # to; N must follow them.
        nested = processor_kwargs.get("images_kwargs")
        self._kwargs: dict[str, Any] = {
            **{k: v for k, v in processor_kwargs.items() if k != "images_kwargs"},
            **(dict(nested) if isinstance(nested, Mapping) else {}),
        }
        self._merge = int(self._kwargs.get("merge_size", image_processor.merge_size))

    def pad_tokens(self, width: int, height: int) -> int:
        patches = self._processor.get_number_of_image_patches(height, width, dict(self._kwargs))
        features = int(patches) // (self._merge * self._merge)
        placed = self._engine_count(width, height)
        if placed != features:
            raise InvalidRequest(
                f"the model cannot take a {width}x{height} image: its vision encoder makes "
                f"{features} features of it, which the engine would place as {placed} pad "
                "tokens"
            )
        return features

    def __call__(self, data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
        fmt = FORMATS.get(_normalise_mime(mime))
        if fmt is None:
            raise InvalidRequest(f"mime {mime!r} is not one of {', '.join(FORMATS)}")
        bound = self._max_pixels if self._max_pixels is not None else Image.MAX_IMAGE_PIXELS
        left = ""
        if max_pixels is not None and (bound is None or max_pixels < bound):
            bound, left = max_pixels, " (what the prompt's other images left)"
        try:
            # open() reads the header only; PIL's own bomb check there warns (a warning
            # is not ours to filter from a worker thread) or raises past twice its bound.
            with Image.open(io.BytesIO(data), formats=[fmt]) as opened:
                width, height = opened.size
                if bound is not None and width * height > bound:
                    raise InvalidRequest(
                        f"the image is too large to decode: {width}x{height} pixels, more "
                        f"than {bound}{left}"
                    )
                # convert() decodes every pixel: a truncated file fails now.
                picture = opened.convert("RGB")
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
            raise InvalidRequest(
                f"the image is too large to decode: more than {bound} pixels"
            ) from exc
        except (OSError, ValueError, SyntaxError) as exc:  # PIL's ways of saying "not this"
            # PIL's text names our objects ("<_io.BytesIO object at 0x...>"): logged only.
            raise InvalidRequest.withholding(
                f"the image bytes do not decode as {mime}", exc, level=logging.INFO
            ) from exc
        width, height = picture.size
        try:
            pads = self.pad_tokens(width, height)
        except ValueError as exc:  # e.g. an aspect ratio the processor refuses
            raise InvalidRequest.withholding(
                f"the model cannot take a {width}x{height} image", exc, level=logging.INFO
            ) from exc
        return DecodedImage(
            pixels=picture,
            digest=hashlib.sha256(data).hexdigest(),
            pad_tokens=pads,
            pixel_count=width * height,
        )


def collapse_blocks(
    prompt_ids: Sequence[int], images: Sequence[PromptImage], vision: VisionInfo
) -> list[int]:
    """`prompt_ids` with each image's pad run shortened to one pad token, after checking
    that the blocks are where `images` say, in order, and hold every pad token."""
    previous_end = 0
    for i, block in enumerate(images):
        if block.start < previous_end or block.end > len(prompt_ids):
            raise InvalidRequest(
                f"image {i}: the block [{block.start}, {block.end}) is out of order, "
                f"overlaps another, or ends past the prompt ({len(prompt_ids)} tokens)"
            )
        pads = block.end - block.start - 2
        if pads != block.image.pad_tokens or not _is_block(prompt_ids, block, vision):
            raise InvalidRequest(
                f"image {i}: [{block.start}, {block.end}) is not a vision block of "
                f"{block.image.pad_tokens} pad tokens"
            )
        previous_end = block.end
    pads = sum(block.image.pad_tokens for block in images)
    if list(prompt_ids).count(vision.pad_token_id) != pads:
        raise InvalidRequest("the prompt holds image pad tokens outside every image block")
    collapsed: list[int] = []
    copied = 0
    for block in images:
        collapsed.extend(prompt_ids[copied : block.start + 2])  # through the first pad
        copied = block.end - 1  # from the end marker
    collapsed.extend(prompt_ids[copied:])
    return collapsed


def _is_block(prompt_ids: Sequence[int], block: PromptImage, vision: VisionInfo) -> bool:
    pads = prompt_ids[block.start + 1 : block.end - 1]
    return (
        prompt_ids[block.start] == vision.start_token_id
        and prompt_ids[block.end - 1] == vision.end_token_id
        and list(pads).count(vision.pad_token_id) == len(pads)
    )
