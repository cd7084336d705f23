"""A LoRA adapter checked before vLLM is asked to load it.

vLLM's engine reports an adapter it cannot take (a missing or malformed
`adapter_config.json`, a rank above `--max-lora-rank`, a bias, a feature it lacks) with
assorted exceptions from inside its workers; taken at face value, any of them could also
be a bug. So the adapter's configuration is read and judged here first, by vLLM's own
`PEFTHelper` (what its workers run), and an adapter that fails is the client's 400
naming `lora_path`; whatever vLLM raises after that is mapped by type
(`map_engine_errors`) or is a bug (an `InternalError` with an id).

Every refusal tells the client one plain message (`refused`), whatever failed and
whether the path exists: the path, and what vLLM's PEFT reader or the file system said
of it, go to the server's log under the error id the message ends with.
"""

from __future__ import annotations

import json
import os
from typing import Any

from vllm.lora.peft_helper import PEFTHelper

from app.errors import InvalidRequest


def refused(path: str, detail: object) -> InvalidRequest:
    """The one refusal of an adapter: `detail` (and the path) to the log only."""
    return InvalidRequest.withholding(
        "The LoRA adapter at lora_path cannot be loaded", f"{path!r}: {detail}", param="lora_path"
    )


def check_adapter(path: str, lora_config: Any, max_position_embeddings: int | None) -> None:
    """Raise `InvalidRequest` (`refused`) unless the adapter at `path` is one vLLM can
    load."""
    if not os.path.isdir(path):
        raise refused(path, "not a directory")
    config_path = os.path.join(path, "adapter_config.json")
    try:
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError) as exc:
        raise refused(path, f"adapter_config.json is not a readable JSON file: {exc!r}") from exc
    if not isinstance(config, dict):
        raise refused(path, "adapter_config.json does not hold an object")
    try:
        # vLLM's own reading and judging of the configuration, as its workers do.
        helper = PEFTHelper.from_dict(
            {**config, "vllm_max_position_embeddings": max_position_embeddings}
        )
        helper.validate_legal(lora_config)
    except (TypeError, ValueError) as exc:
        raise refused(path, f"vLLM's PEFT reader: {exc!r}") from exc
