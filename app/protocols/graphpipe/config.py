"""An `InferRequest.config`: a JSON object of sampling parameters.

All fields are optional; anything else in the object, or a value of the wrong type, is an
`InvalidRequest` whose message names the field (and whose `param` is `config.<field>`).
The ranges are the ones every protocol shares (`app.engine.validation`), checked with the
same names:

    max_tokens   int >= 1; prompt + max_tokens within the context  (default 16)
    temperature  number in [0, 2]; 0 is greedy                      (default 1)
    top_p        number in (0, 1]                                   (default 1)
    top_k        int >= -1; -1, 0 and the vocabulary size or more mean every token
                                                                    (default every token)
    seed         int in [-2**63, 2**63) or null; -1 is none         (default none)
    stop         string or list of non-empty strings                (default none)
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
from app.wire_text import load_json


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
# What errors of the shared validation call each field.
NAMES = {name: f"config.{name}" for name in FIELDS}


def _invalid(field: str, expected: str, value: object) -> InvalidRequest:
    try:
        got = json.dumps(value)
    except RecursionError:  # as deep as load_json allows, deeper than dumps' stack
        got = f"a {type(value).__name__} nested too deeply"
    return InvalidRequest(f"config.{field} must be {expected}; got {got}", param=f"config.{field}")


def parse_config(raw: bytes) -> InferConfig:
    """The config's fields, type-checked; their ranges are checked with the prompt."""
    if not raw.strip():
        return InferConfig()
    try:
        data = load_json(raw)
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
    return InferConfig(**{name: _TYPES[name](name, value) for name, value in data.items()})


def _int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(name, "an integer", value)
    return value


def _number(name: str, value: Any) -> float:
    # json.loads reads NaN and Infinity; neither is a number a limit can hold.
    finite = isinstance(value, int | float) and not isinstance(value, bool)
    if not finite or not math.isfinite(value):
        raise _invalid(name, "a number", value)
    return float(value)


def _seed(name: str, value: Any) -> int | None:
    return None if value is None else _int(name, value)


def _stop(name: str, value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _invalid(name, "a string or a list of strings", value)
    return tuple(stops)


def _logprobs(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _invalid(name, "true or false", value)
    return value


def _constraint(name: str, value: Any) -> Constraint:
    return parse_constraint(value, f"config.{name}")


_TYPES: dict[str, Callable[[str, Any], Any]] = {
    "max_tokens": _int,
    "temperature": _number,
    "top_p": _number,
    "top_k": _int,
    "seed": _seed,
    "stop": _stop,
    "logprobs": _logprobs,
    "constraint": _constraint,
}
