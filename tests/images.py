"""Images as the image tests send them: random PNGs, and a token prompt with one vision
block that a Salience attachment fills (the tiny vision-language model's sizes)."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image

# A 64x48 image is resized to 56x56: 4x4 patches of 14, merged 2x2 into 4 features.
N = 4


def png(seed: int, width: int = 64, height: int = 48, fmt: str = "PNG") -> bytes:
    """Random pixels (the same for the same seed), encoded as `fmt`."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def attachment(data: bytes, start: int, n: int = N, mime: str = "image/png") -> dict[str, Any]:
    """A Salience image attachment (JSON) over the block of `n` pads that starts at `start`."""
    return {
        "bytes": base64.b64encode(data).decode(),
        "mime": mime,
        "padRangeStart": start,
        "padRangeEnd": start + n + 2,
    }


class Prompt:
    """Text, one image block, text: what a client builds before attaching the image."""

    def __init__(self, server: Any, n: int = N) -> None:
        tok = server.engine.tokenizer
        vision = server.engine.info.vision
        self.head = tok.encode("Look at this:", add_special_tokens=False)
        self.block = [vision.start_token_id, *[vision.pad_token_id] * n, vision.end_token_id]
        self.tail = tok.encode(" it shows", add_special_tokens=False)
        self.tokens = [*self.head, *self.block, *self.tail]
        self.start = len(self.head)
        self.end = self.start + len(self.block)
