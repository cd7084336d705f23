"""A LoRA adapter checked before vLLM is asked to load it.

vLLM's engine reports an adapter it cannot take (a missing or malformed
`adapter_config.json`, a rank above `--max-lora-rank`, a bias, a feature it lacks) with
assorted exceptions from inside its workers; taken at face value, any of them could also
be a bug. So the adapter's configuration is read and judged here first, by vLLM's own
`PEFTHelper` (what its workers run), and an adapter that fails is the client's 400
naming `lora_path`; whatever vLLM raises after that is mapped by type
(`map_engine_errors`) or is a bug (an `InternalError` with an id).
"""

from __future__ import annotations

import json
import os
from typing import Any

from vllm.lora.peft_helper import PEFTHelper

from app.errors import InvalidRequest


def check_adapter(path: str, lora_config: Any, max_position_embeddings: int | None) -> None:
    """Raise `InvalidRequest` unless the adapter at `path` is one vLLM can load."""
    if not os.path.isdir(path):
        raise InvalidRequest(f"No LoRA adapter directory at {path!r}", param="lora_path")
    config_path = os.path.join(path, "adapter_config.json")
    try:
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
    except FileNotFoundError:
        raise InvalidRequest(f"No adapter_config.json in {path!r}", param="lora_path") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequest(
            f"{config_path!r} is not a readable JSON file: {exc}", param="lora_path"
        ) from exc
    if not isinstance(config, dict):
        raise InvalidRequest(f"{config_path!r} does not hold an object", param="lora_path")
    try:
        # vLLM's own reading and judging of the configuration, as its workers do.
        helper = PEFTHelper.from_dict(
            {**config, "vllm_max_position_embeddings": max_position_embeddings}
        )
        helper.validate_legal(lora_config)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"The LoRA adapter at {path!r}: {exc}", param="lora_path") from exc
