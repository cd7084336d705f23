"""An `InferRequest.config`: a JSON object of sampling parameters.

All fields are optional; anything else in the object, or a value of the wrong type or
out of range, is an `InvalidRequest` whose message names the field (and whose `param` is
`config.<field>`):

    max_tokens   int, 1 .. the model's context length      (default 16)
    temperature  number >= 0; 0 is greedy                  (default 1)
    top_p        number in (0, 1]                          (default 1)
    top_k        int >= -1; -1 and 0 mean every token      (default every token)
    seed         int in [0, 2**63) or null                 (default none: not reproducible)
    stop         string or list of non-empty strings       (default none)
    logprobs     bool: with no `output_names`, return `logprobs` after `text`  (default false)
    constraint   object: what the output must match, as vLLM's `structured_outputs`
                 names it: exactly one of {"json": schema}, {"regex": str},
                 {"choice": [str, ...]}, {"grammar": str}, {"json_object": true}
                 (default none). Example: {"max_tokens": 64, "constraint": {"choice":
                 ["yes", "no"]}}. A schema, regex or grammar the engine cannot compile
                 is `config.constraint.<kind>`'s error.

An empty config means every default. `bool` is not accepted where a number is (JSON's
`true` is not 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.engine.constraints import Constraint, parse_constraint
from app.errors import InvalidRequest

_SEED_LIMIT = 2**63


@dataclass(frozen=True, slots=True)
class InferConfig:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    constraint: Constraint | None = None


FIELDS = tuple(InferConfig.__dataclass_fields__)


def _invalid(field: str, expected: str, value: object) -> InvalidRequest:
    return InvalidRequest(
        f"config.{field} must be {expected}; got {json.dumps(value)}", param=f"config.{field}"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


def parse_config(raw: bytes, max_model_len: int) -> InferConfig:
    if not raw.strip():
        return InferConfig()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"config is not valid JSON: {exc}", param="config") from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"config must be a JSON object of sampling parameters ({', '.join(FIELDS)})",
            param="config",
        )
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"config.{unknown[0]} is not a sampling parameter; known: {', '.join(FIELDS)}",
            param=f"config.{unknown[0]}",
        )
    return InferConfig(
        **{name: _CHECKS[name](value, max_model_len) for name, value in data.items()}
    )


def _max_tokens(value: Any, max_model_len: int) -> int:
    if not _is_int(value) or not 1 <= value <= max_model_len:
        raise _invalid("max_tokens", f"an integer from 1 to {max_model_len}", value)
    return int(value)


def _temperature(value: Any, _: int) -> float:
    if not _is_number(value) or value < 0:
        raise _invalid("temperature", "a number >= 0", value)
    return float(value)


def _top_p(value: Any, _: int) -> float:
    if not _is_number(value) or not 0 < value <= 1:
        raise _invalid("top_p", "a number in (0, 1]", value)
    return float(value)


def _top_k(value: Any, _: int) -> int:
    if not _is_int(value) or value < -1:
        raise _invalid("top_k", "an integer >= -1 (-1 or 0: every token)", value)
    return 0 if value == -1 else int(value)


def _seed(value: Any, _: int) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value < _SEED_LIMIT:
        raise _invalid("seed", "an integer in [0, 2**63) or null", value)
    return int(value)


def _stop(value: Any, _: int) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _invalid("stop", "a non-empty string or a list of non-empty strings", value)
    return tuple(stops)


def _logprobs(value: Any, _: int) -> bool:
    if not isinstance(value, bool):
        raise _invalid("logprobs", "true or false", value)
    return value


def _constraint(value: Any, _: int) -> Constraint:
    return parse_constraint(value, "config.constraint")


_CHECKS: dict[str, Callable[[Any, int], Any]] = {
    "max_tokens": _max_tokens,
    "temperature": _temperature,
    "top_p": _top_p,
    "top_k": _top_k,
    "seed": _seed,
    "stop": _stop,
    "logprobs": _logprobs,
    "constraint": _constraint,
}
