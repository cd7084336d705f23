"""The one model lookup: which served model a request names, for every protocol.

Every protocol names its model in a field of its own (OpenAI's and the render routes'
`model`, /tokenize's and /detokenize's `model`, GraphPipe's `/graphpipe/<model>` path,
Evergreen's `target_spec.id`, Salience's `OpenSessionRequest.model`); each passes it to
`resolve_model`, which answers the same way for all of them:

- no name (None or empty) is the base model, as `vllm serve` reads a missing `model`;
- the base model's served name is the base model, with no LoRA adapter;
- a loaded LoRA adapter's name is that adapter;
- anything else is `ModelNotFound` (404, NOT_FOUND), worded once, as `vllm serve` words
  it: "The model `x` does not exist."

`has_model` is `Engine.has_model` (adapters come and go at run time), or a narrower
predicate where a protocol serves fewer models (Salience's sessions run on the base
model only, so it passes one that knows no adapter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.engine.base import Engine
from app.errors import ModelNotFound


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # the served name: the one asked for, or the base model's
    lora_name: str | None  # the LoRA adapter to generate with; None for the base model


def served_by(engine: Engine, requested: str | None) -> ServedModel:
    """The model `requested` names among every model `engine` serves."""
    return resolve_model(requested, engine.info.model_name, engine.has_model)


def resolve_model(
    requested: str | None, base: str, has_model: Callable[[str], bool]
) -> ServedModel:
    """The model `requested` names (`base`: the base model's served name)."""
    if not requested or requested == base:
        return ServedModel(base, None)
    if not has_model(requested):
        raise ModelNotFound(f"The model `{requested}` does not exist.", param="model")
    return ServedModel(requested, requested)
