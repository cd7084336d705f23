"""Reading images with the tiny vision-language model's own image processor (no engine):
decoding by the declared mime type only, refusals, and N, the pad tokens of an image,
against the grid the processor actually makes of its pixels. And the prompt vLLM gets:
each image's pad run collapsed to one pad."""

from __future__ import annotations

import base64
import hashlib
import io
import zlib
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile

from app.engine import base
from app.engine.base import DecodedImage, EngineInfo, PromptImage, ReadImage, VisionInfo
from app.engine.images import ImageReader, collapse_blocks
from app.errors import InvalidRequest
from app.protocols.openai.chat import conversation
from app.tiny_vl_model import MAX_IMAGE_TOKENS, MIN_IMAGE_TOKENS
from schemas.openai import ChatCompletionRequest
from tests.conftest import tiny_vl_model_path


@pytest.fixture(scope="module")
def processor() -> Any:
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(tiny_vl_model_path()))


def reader(processor: Any, kwargs: dict[str, Any] | None = None) -> ImageReader:
    """A reader whose engine places every image as the processor counts it (the live
    engine's own count is checked in the e2e tests)."""
    merge: int = processor.merge_size**2
    flat = dict((kwargs or {}).get("images_kwargs", {}))

    def count(width: int, height: int) -> int:
        return int(processor.get_number_of_image_patches(height, width, flat)) // merge

    return ImageReader(processor, kwargs or {}, count)


def encode(width: int, height: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize(
    ("width", "height"), [(64, 48), (56, 56), (1, 1), (300, 300), (600, 20), (17, 900)]
)
def test_pad_tokens_are_the_features_the_encoder_gets(
    processor: Any, width: int, height: int
) -> None:
    data = encode(width, height)
    image = reader(processor)(data, "image/png")
    grid = processor(images=[Image.open(io.BytesIO(data))], return_tensors="np")["image_grid_thw"]
    assert image.pad_tokens == int(np.prod(grid[0])) // processor.merge_size**2
    if max(width, height) / min(width, height) < 4:  # extreme ratios overshoot the bounds
        assert MIN_IMAGE_TOKENS <= image.pad_tokens <= MAX_IMAGE_TOKENS
    assert image.digest == hashlib.sha256(data).hexdigest()
    assert isinstance(image.pixels, Image.Image)
    assert image.pixels.size == (width, height) and image.pixels.mode == "RGB"


def test_processor_kwargs_change_the_count(processor: Any) -> None:
    data = encode(280, 280)
    small = {"max_pixels": 28 * 28 * 4}
    assert reader(processor, {"images_kwargs": small})(data, "image/png").pad_tokens == 4
    assert reader(processor)(data, "image/png").pad_tokens == MAX_IMAGE_TOKENS


def test_an_image_the_engine_would_place_differently_is_refused(processor: Any) -> None:
    refusing = ImageReader(processor, {}, lambda width, height: 0)
    with pytest.raises(InvalidRequest, match=r"makes 4 features of it.*as 0 pad tokens"):
        refusing(encode(56, 56), "image/png")


def test_jpeg_and_webp_decode_under_their_own_mime(processor: Any) -> None:
    read = reader(processor)
    assert read(encode(56, 56, "JPEG"), "image/jpeg").pad_tokens == 4
    assert read(encode(56, 56, "WEBP"), "Image/WebP; q=1").pad_tokens == 4


@pytest.mark.parametrize(
    ("data", "mime", "message"),
    [
        (encode(56, 56, "JPEG"), "image/png", "do not decode as image/png"),
        (encode(56, 56), "image/jpeg", "do not decode as image/jpeg"),
        (encode(56, 56)[:200], "image/png", "do not decode"),  # truncated
        (b"", "image/png", "do not decode"),
        (b"not an image at all", "image/gif", "do not decode"),
        (encode(56, 56), "image/tiff", "is not one of"),
        (encode(56, 56), "", "is not one of"),
        (encode(56, 56), "application/postscript", "is not one of"),
    ],
)
def test_bad_images_are_invalid_requests(
    processor: Any, data: bytes, mime: str, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as info:
        reader(processor)(data, mime)
    # PIL's own text names our objects ("<_io.BytesIO object at 0x...>"): the log has it.
    assert "0x" not in info.value.message and "BytesIO" not in info.value.message


def test_a_decompression_bomb_is_refused(processor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    # PIL's own check warns at open (under twice its bound), whatever the reader does.
    with (
        pytest.raises(InvalidRequest, match="too large"),
        pytest.warns(Image.DecompressionBombWarning),
    ):
        reader(processor)(encode(40, 40), "image/png")


def _png_header(width: int, height: int) -> bytes:
    """A PNG that is all header: a signature and an IHDR claiming width x height RGB
    pixels, then an IDAT that decodes nothing."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + kind + body + crc

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b""))


@pytest.mark.parametrize(
    ("data", "max_pixels"),
    [
        (encode(40, 40), 1000),  # a real image over the reader's own bound
        (_png_header(30_000, 30_000), None),  # 900M pixels: decoding would take ~2.7 GB
    ],
    ids=["own-bound", "header-30000x30000"],
)
def test_the_pixel_bound_is_checked_from_the_header_before_decoding(
    processor: Any, monkeypatch: pytest.MonkeyPatch, data: bytes, max_pixels: int | None
) -> None:
    decoded: list[object] = []

    def load(self: Any) -> Any:
        decoded.append(self)
        raise AssertionError("decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    read = ImageReader(processor, {}, lambda width, height: 0, max_pixels=max_pixels)
    with pytest.raises(InvalidRequest, match="too large to decode"):
        read(data, "image/png")
    assert decoded == []


def _chat(*images: bytes) -> ChatCompletionRequest:
    parts = [
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()},
        }
        for data in images
    ]
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": parts}]}
    )


def _vl_info(read: ReadImage, max_images: int) -> EngineInfo:
    vision = VisionInfo(5, 7, 6, max_images=max_images, read_image=read)
    return EngineInfo("vl", "/vl", 256, 100, (2,), False, 0, vision=vision)


def test_a_prompt_past_its_image_count_decodes_none_past_it() -> None:
    """The engine's max_images per prompt is counted as images are read: the one past it
    is refused before it is decoded (the engine's own check comes after all are)."""
    read: list[bytes] = []

    def decode(data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
        read.append(data)
        return DecodedImage(None, data.hex(), 1, pixel_count=1)

    info = _vl_info(decode, max_images=2)
    with pytest.raises(InvalidRequest, match=r"content\.2\.image_url: a prompt takes at most 2"):
        conversation(_chat(b"a", b"b", b"c"), info, request_id="r", lora_name=None)
    assert read == [b"a", b"b"]


def test_a_prompts_images_share_one_pixel_budget(
    processor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small files that each inflate: each is within one image's bound, together
    past the prompt's, and the one past it is refused from its header, undecoded."""
    monkeypatch.setattr(base, "MAX_PROMPT_PIXELS", 3 * 56 * 56)
    decoded: list[int] = []
    reader_ = reader(processor)

    def counting(data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
        image = reader_(data, mime, max_pixels)
        decoded.append(image.pixel_count)
        return image

    info = _vl_info(counting, max_images=8)
    three = _chat(*[encode(56, 56, seed=i) for i in range(3)])
    assert len(conversation(three, info, request_id="r", lora_name=None).messages) == 1
    decoded.clear()
    four = _chat(*[encode(56, 56, seed=i) for i in range(4)])
    with pytest.raises(
        InvalidRequest, match=r"content\.3\.image_url: .*56x56 pixels, more than 0 \(what"
    ):
        conversation(four, info, request_id="r", lora_name=None)
    assert decoded == [56 * 56] * 3


VISION = VisionInfo(
    start_token_id=5,
    pad_token_id=7,
    end_token_id=6,
    max_images=8,
    read_image=lambda data, mime, max_pixels=None: DecodedImage(None, "", 0),
)


def image(start: int, n: int) -> PromptImage:
    return PromptImage(start, start + n + 2, DecodedImage(None, f"d{start}", n))


def test_collapse_keeps_one_pad_per_block() -> None:
    prompt = [1, 5, 7, 7, 7, 6, 2, 5, 7, 7, 6]
    assert collapse_blocks(prompt, [image(1, 3), image(7, 2)], VISION) == [1, 5, 7, 6, 2, 5, 7, 6]


@pytest.mark.parametrize(
    ("prompt", "images", "message"),
    [
        ([1, 5, 7, 7, 6, 2], [image(1, 3)], "not a vision block of 3"),  # the run is 2
        ([1, 5, 7, 9, 6], [image(1, 2)], "not a vision block"),
        ([1, 5, 7, 6, 7], [image(1, 1)], "outside every image block"),
        ([5, 7, 6, 5, 7, 6], [image(3, 1), image(0, 1)], "out of order"),
        ([5, 7, 6], [image(1, 1)], "ends past the prompt"),
    ],
)
def test_collapse_refuses_blocks_that_are_not_there(
    prompt: list[int], images: list[PromptImage], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        collapse_blocks(prompt, images, VISION)
