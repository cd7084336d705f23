"""How a vision-language model takes images: `vision_info(llm)`.

A model whose image blocks are `start + N * pad + end` (the Qwen2-VL layout,
`hf_config.vision_start_token_id` / `image_token_id` / `vision_end_token_id`) with an
image processor that counts N takes images; any other model is served without them.
"""

from __future__ import annotations

import logging

from vllm.v1.engine.async_llm import AsyncLLM

from app.engine.base import VisionInfo
from app.engine.images import ImageReader

logger = logging.getLogger(__name__)


def vision_info(llm: AsyncLLM) -> VisionInfo | None:
    """How the model takes images, or None if it takes none we can place."""
    model_config = llm.model_config
    if not model_config.is_multimodal_model:
        return None
    hf_config = model_config.hf_config
    start = getattr(hf_config, "vision_start_token_id", None)
    pad = getattr(hf_config, "image_token_id", None)
    end = getattr(hf_config, "vision_end_token_id", None)
    processing = llm.renderer.get_mm_processor().info
    image_processor = getattr(processing.get_hf_processor(), "image_processor", None)
    if (
        start is None
        or pad is None
        or end is None
        or image_processor is None
        or not hasattr(image_processor, "get_number_of_image_patches")
        or not hasattr(image_processor, "merge_size")
        or not hasattr(processing, "get_num_image_tokens")
    ):
        logger.warning(
            "%s is multimodal, but its image blocks are not start + N pads + end with an "
            "image processor that counts N; it is served without images",
            model_config.model,
        )
        return None
    mm_config = model_config.get_multimodal_config()
    mm_kwargs = mm_config.mm_processor_kwargs or {}

    def engine_count(width: int, height: int) -> int:
        # The number of pads vLLM's processor replaces an image's placeholder with; it
        # merges the configured processor kwargs itself (a request adds none).
        return int(
            processing.get_num_image_tokens(
                image_width=width,
                image_height=height,
                image_processor=image_processor,
                mm_kwargs={},
            )
        )

    return VisionInfo(
        start_token_id=int(start),
        pad_token_id=int(pad),
        end_token_id=int(end),
        max_images=int(mm_config.get_limit_per_prompt("image")),
        read_image=ImageReader(image_processor, mm_kwargs, engine_count),
    )
