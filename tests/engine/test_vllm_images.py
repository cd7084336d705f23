"""Images through the engine seam on real vLLM (the tiny vision-language model): vLLM
gets each block collapsed and expands it back to the request's exact tokens, the prefix
cache keys blocks on the image, and the model never samples its vision tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.engine.base import GenerationRequest, PromptImage, SamplingOptions, TokenEvent
from app.errors import InvalidRequest
from tests.conftest import LiveServer
from tests.images import png

pytestmark = pytest.mark.engine


async def _run(engine: Any, request: GenerationRequest) -> list[TokenEvent]:
    return [event async for event in engine.generate(request)]


def with_image(
    engine: Any, head: list[int], seed: int, tail: list[int]
) -> tuple[list[int], PromptImage]:
    vision = engine.info.vision
    image = vision.read_image(png(seed), "image/png")
    block = [vision.start_token_id, *[vision.pad_token_id] * image.pad_tokens, vision.end_token_id]
    return [*head, *block, *tail], PromptImage(len(head), len(head) + len(block), image)


def test_the_engine_runs_exactly_the_expanded_tokens(vl_server: LiveServer) -> None:
    engine = vl_server.engine
    tok = engine.tokenizer
    ids, image = with_image(engine, tok.encode("a picture:"), 1, tok.encode(" of"))
    request = GenerationRequest(
        "img-echo",
        prompt_token_ids=ids,
        sampling=SamplingOptions(max_tokens=3, temperature=0.0, prompt_logprobs=0),
        images=(image,),
    )
    events = vl_server.call(_run(engine, request))
    assert events[0].prompt_token_ids == ids
    assert events[0].prompt_logprobs is not None and len(events[0].prompt_logprobs) == len(ids)
    assert sum(len(e.token_ids) for e in events) == 3


def test_blocks_that_do_not_match_their_images_are_refused(vl_server: LiveServer) -> None:
    engine = vl_server.engine
    tok = engine.tokenizer
    ids, image = with_image(engine, tok.encode("x"), 1, tok.encode(" y"))
    pad = engine.info.vision.pad_token_id
    one_more = [*ids[: image.end - 1], pad, *ids[image.end - 1 :]]
    for prompt, images, message in [
        (one_more, (PromptImage(image.start, image.end + 1, image.image),), "not a vision block"),
        ([*ids, pad], (image,), "outside every image block"),
    ]:
        request = GenerationRequest(
            "img-bad",
            prompt_token_ids=prompt,
            sampling=SamplingOptions(max_tokens=1),
            images=images,
        )
        with pytest.raises(InvalidRequest, match=message):
            vl_server.call(_run(engine, request))
    assert vl_server.running_requests() == 0


def test_the_prefix_cache_is_shared_up_to_the_image(vl_server: LiveServer) -> None:
    engine = vl_server.engine
    block_size = engine._llm.vllm_config.cache_config.block_size
    tok = engine.tokenizer
    head = (tok.encode("import os\n", add_special_tokens=False) * block_size)[: block_size + 8]
    tail = (tok.encode(" print(x)\n", add_special_tokens=False) * block_size)[:block_size]

    def cached(seed: int, request_id: str) -> int:
        ids, image = with_image(engine, head, seed, tail)
        request = GenerationRequest(
            request_id,
            prompt_token_ids=ids,
            sampling=SamplingOptions(max_tokens=1),
            images=(image,),
        )
        return vl_server.call(_run(engine, request))[0].num_cached_tokens

    cached(11, "img-cache-1")
    # The same image: every full block is reused.
    assert cached(11, "img-cache-2") >= 2 * block_size
    # Another image behind the same tokens: only the blocks before the image are.
    assert cached(12, "img-cache-3") == block_size


def test_the_model_never_samples_its_vision_tokens(vl_server: LiveServer) -> None:
    engine = vl_server.engine
    banned = engine.info.vision.token_ids
    # Find contexts where the model's own (raw) top choice is a vision token: the top-1
    # alternative of each prompt position is its argmax next token.
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(10, engine.info.vocab_size, 500)]
    scan = GenerationRequest(
        "img-scan", prompt_token_ids=ids, sampling=SamplingOptions(max_tokens=0, prompt_logprobs=1)
    )
    positions = vl_server.call(_run(engine, scan))[0].prompt_logprobs or []
    wanting = [
        i
        for i, entry in enumerate(positions)
        if entry is not None and next(iter(entry.top)) in banned
    ]
    assert wanting, "no context in the scan prefers a vision token; scan more positions"
    for i in wanting[:3]:
        greedy = GenerationRequest(
            f"img-ban-{i}",
            prompt_token_ids=ids[:i],
            sampling=SamplingOptions(max_tokens=1, temperature=0.0, logprobs=3),
        )
        event = vl_server.call(_run(engine, greedy))[0]
        assert event.logprobs is not None and next(iter(event.logprobs[0].top)) in banned
        assert event.token_ids[0] not in banned
