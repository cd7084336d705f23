"""Constrained decoding in the engine seam: one neutral `Constraint` every protocol maps
its own request options to (OpenAI's `response_format` / `structured_outputs` /
`tool_choice`, GraphPipe's config, Evergreen's GENERATE config), and the one check of
a constraint and of a logit bias (`app.engine.validation.validate_constraints`, which
also asks the engine's backend).

Neutral: no vLLM here. The engine enforces a constraint with its structured-output
backend and says, through `EngineInfo.check_constraint`, whether that backend can
compile it; so an invalid schema, regex or grammar is the client's error (a 400 naming
its field) before any engine request exists, never a failed or dead engine.

Invariants:
- A `Constraint` holds exactly one kind: `json` (a JSON schema, as JSON text),
  `json_object` (any JSON object; no spec), `regex`, `choice` (one of the strings) or
  `grammar` (EBNF/Lark text as the engine's backends read it), or `structural_tag` (the
  engine's own tagged-format description, JSON text; made by its tool parser for forced
  tool calls, never taken from a client).
- `SamplingOptions.logit_bias` holds (token id, bias) pairs with ids in the vocabulary
  and biases in [-100, 100], each id once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.errors import InvalidRequest
from app.wire_text import load_json

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]
KINDS: tuple[ConstraintKind, ...] = (
    "json",
    "json_object",
    "regex",
    "choice",
    "grammar",
    "structural_tag",
)
_CLIENT_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# The largest spec a client may send: the engine's backend parses it on the prompt-building
# thread at some microseconds a byte (xgrammar read a 300 KB JSON schema in 1.3 s), then
# compiles it in the engine. 128 KiB holds a schema of a thousand properties.
MAX_SPEC_BYTES = 128 * 1024
MAX_BIAS = 100.0  # OpenAI's documented range, and what vLLM clamps to


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the output must match. `spec` is the schema's JSON text (`json`), the
    pattern (`regex`), the grammar (`grammar`), the options (`choice`), or None
    (`json_object`). `param` is the client's name for where it came from, so an error
    found later (by the engine's backend) still names the client's field."""

    kind: ConstraintKind
    spec: str | tuple[str, ...] | None = None
    param: str = "constraint"


def json_constraint(schema: object, param: str) -> Constraint:
    """A `json` constraint from a schema given as a JSON object (or its JSON text)."""
    if isinstance(schema, str):
        try:
            schema = load_json(schema)
        except ValueError as exc:
            raise InvalidRequest(f"{param} is not valid JSON: {exc}", param=param) from exc
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON schema object", param=param)
    try:
        text = json.dumps(schema, allow_nan=False)
    except ValueError as exc:
        raise InvalidRequest(f"{param} holds a non-finite number", param=param) from exc
    return Constraint("json", text, param)


def check_shape(constraint: Constraint) -> None:
    param = constraint.param
    spec = constraint.spec
    if isinstance(spec, tuple):
        size = sum(len(option) for option in spec if isinstance(option, str))
    else:
        size = len(spec) if isinstance(spec, str) else 0
    if size > MAX_SPEC_BYTES and constraint.kind != "structural_tag":
        raise InvalidRequest(
            f"{param} is {size} characters long; at most {MAX_SPEC_BYTES}", param=param
        )
    if constraint.kind == "json_object":
        if spec is not None:
            raise InvalidRequest("a json_object constraint takes no spec", param=param)
        return
    if constraint.kind == "choice":
        if not isinstance(spec, tuple) or not spec:
            raise InvalidRequest(f"{param} must be a non-empty list of strings", param=param)
        if not all(isinstance(option, str) for option in spec):
            raise InvalidRequest(f"{param} must hold strings only", param=param)
        return
    if not isinstance(spec, str):
        raise InvalidRequest(f"{param} must be a string", param=param)
    if "\x00" in spec:
        raise InvalidRequest(f"{param} must not contain a NUL character", param=param)
    if constraint.kind == "grammar" and not spec.strip():
        raise InvalidRequest(f"{param} must not be empty", param=param)
    if constraint.kind == "json":
        try:
            schema = load_json(spec)
        except ValueError as exc:
            raise InvalidRequest(f"{param} is not valid JSON: {exc}", param=param) from exc
        if not isinstance(schema, dict):
            raise InvalidRequest(f"{param} must be a JSON schema object", param=param)


def parse_constraint(value: object, param: str) -> Constraint:
    """A constraint given as vLLM's `structured_outputs` names it: an object with exactly
    one of json (a schema), regex, choice (a list of strings), grammar, json_object
    (true); other keys (vLLM's per-request options) are accepted and ignored. The one
    reading every protocol uses (OpenAI's extra, GraphPipe's and Evergreen's configs)."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(
            f"{param} must be an object with one of {', '.join(_CLIENT_KINDS)}", param=param
        )
    kinds = [k for k in _CLIENT_KINDS if value.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidRequest(
            f"{param} takes exactly one of {', '.join(_CLIENT_KINDS)}",
            param=param,
        )
    kind = kinds[0]
    where = f"{param}.{kind}"
    spec = value[kind]
    if kind == "json":
        constraint = json_constraint(spec, where)
    elif kind == "json_object":
        if spec is not True:
            raise InvalidRequest(f"{where} must be true if set", param=where)
        constraint = Constraint("json_object", None, where)
    elif kind == "choice":
        if not isinstance(spec, list) or not all(isinstance(s, str) for s in spec):
            raise InvalidRequest(f"{where} must be a list of strings", param=where)
        constraint = Constraint("choice", tuple(spec), where)
    else:
        if not isinstance(spec, str):
            raise InvalidRequest(f"{where} must be a string", param=where)
        constraint = Constraint("regex" if kind == "regex" else "grammar", spec, where)
    return constraint


def logit_bias_pairs(
    bias: Mapping[str, Any] | Mapping[int, Any], param: str
) -> tuple[tuple[int, float], ...]:
    """A client's `{token id: bias}` map (keys as strings, as JSON has them) -> sorted
    pairs; the ranges are checked by `app.engine.validation.validate_constraints`."""
    pairs: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(
                f"{param} keys must be token ids, not {key!r}", param=param
            ) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(f"{param} values must be numbers", param=param)
        pairs[token] = float(value)
    return tuple(sorted(pairs.items()))
