"""OpenAI's output steering -> the engine seam's neutral fields: `response_format`
(`text`, `json_object`, `json_schema`) and vLLM's `structured_outputs` extra (exactly one
of json, regex, choice, grammar, json_object) -> `Constraint`; `logit_bias` -> pairs.

As `vllm serve` does, a non-text `response_format` wins over `structured_outputs`, and
`structured_outputs`' per-request options (`disable_any_whitespace`, ...) are accepted and
left to the server-wide `--structured-outputs-config`, which is what vLLM 0.32 reads. The
checks that need the model (token ids, whether the backend compiles the schema) are
`app.engine.validation.validate_constraints`, which the shared
`app.engine.validation.validate_sampling` calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.engine.constraints import (
    Constraint,
    json_constraint,
    logit_bias_pairs,
    parse_constraint,
)
from app.errors import InvalidRequest
from schemas.openai import SamplingFields


def _response_format(value: Mapping[str, Any]) -> Constraint | None:
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", None, "response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidRequest(
                "response_format json_schema needs a 'json_schema' object",
                param="response_format.json_schema",
            )
        if "schema" not in spec:
            raise InvalidRequest(
                "response_format json_schema needs 'json_schema.schema'",
                param="response_format.json_schema.schema",
            )
        return json_constraint(spec["schema"], "response_format.json_schema.schema")
    raise InvalidRequest(
        f"response_format type {kind!r} is not one of text, json_object, json_schema",
        param="response_format.type",
    )


def request_constraint(body: SamplingFields) -> Constraint | None:
    """The constraint `body` asks for, or None."""
    if body.response_format is not None:
        constraint = _response_format(body.response_format)
        if constraint is not None:
            return constraint
    if body.structured_outputs is not None:
        return parse_constraint(body.structured_outputs, "structured_outputs")
    return None


def request_logit_bias(body: SamplingFields) -> tuple[tuple[int, float], ...]:
    return logit_bias_pairs(body.logit_bias or {}, "logit_bias")
