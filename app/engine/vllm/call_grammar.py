"""The constraint that forces a tool call, as the server's structured-output backend
enforces it, admitting only calls the tool parser reads back. vLLM side of the seam.

vLLM's tool parser describes a forced call (`tool_choice` required or named, and `auto`
over strict tools) as an xgrammar structural tag: the model's own call format (hermes:
`<tool_call>\\n{"name": "f", "arguments": ` ... `}\\n</tool_call>`) around each tool's
JSON schema; parsers without a tag format get a plain JSON schema. vLLM 0.32 hands either
to the backend as it is, and what the backend then admits is not what the parser
(`json.loads`) reads:

1. The server's `--structured-outputs-config` never reaches a tag: vLLM applies
   `disable_any_whitespace` to `json` and `json_object` constraints only, so a call's JSON
   admits any whitespace (a random model pads it until `max_tokens`).
2. xgrammar 0.2.8's JSON grammar admits text that is not JSON, or not the schema's (raw
   control characters in bounded strings, surrogates, ", " with whitespace disabled:
   `app.engine.vllm.json_grammar`).
3. A tool that is not strict has its arguments as any JSON value (`5`, `[]`), where every
   API promises an object.

So the constraint is lowered here, before the engine sees it, for the server's backend:
- xgrammar (and vLLM's `auto`, which picks xgrammar for these): each JSON schema in the
  tag becomes the EBNF xgrammar's own converter makes of it with the server's whitespace
  rule, its string rules corrected (`json_grammar`); the tag's format is kept, and vLLM's
  xgrammar backend compiles it as before;
- guidance: vLLM's guidance backend reads only the legacy `structures` form of a tag, so
  the tag becomes a Lark grammar with each schema inline (`%json`, the whitespace rule in
  its `x-guidance`), which llguidance compiles as any grammar (its JSON strings are JSON:
  no correction needed). `auto` over strict tools (a triggered tag) is not lowered: 400;
- the others (outlines, lm-format-enforcer) take no grammar of that kind: a clear 400
  naming `tool_choice`, never a grammar the backend misreads.

Invariant (tests/unit/test_call_grammar.py walks the lowered tags at random and feeds
each text to vLLM's hermes parser): every call the constraint admits is read back as a
call, whole and streamed.
"""

from __future__ import annotations

import json
from typing import Any

from vllm.config import StructuredOutputsConfig
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.structured_output.backend_guidance import process_for_additional_properties

from app.engine.constraints import Constraint
from app.engine.vllm.json_grammar import json_grammar
from app.errors import InvalidRequest


def _arguments(schema: Any) -> Any:
    """A tool's arguments are an object, whatever its strictness left of its schema."""
    return {"type": "object"} if schema is True or schema == {} else schema


def _lower_tag(node: Any, whitespace: bool) -> Any:
    """The structural tag `node` (as JSON) with each JSON-style schema in it replaced by
    its corrected grammar."""
    if isinstance(node, list):
        return [_lower_tag(item, whitespace) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and node.get("style", "json") == "json":
        schema = _arguments(node["json_schema"])
        return {"type": "grammar", "grammar": json_grammar(schema, whitespace)}
    return {key: _lower_tag(value, whitespace) for key, value in node.items()}


class _Lark:
    """A structural tag as a Lark grammar for llguidance: each JSON schema inline
    (`%json`), with the server's whitespace rule as llguidance takes it (`x-guidance`, a
    schema's own winning as it does in vLLM's guidance backend). The tag's formats that
    a forced call is made of; others raise `_Unsupported`."""

    def __init__(self, config: StructuredOutputsConfig) -> None:
        self._config = config
        self.rules: list[str] = []

    def _rule(self, body: str) -> str:
        name = f"part_{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def _json(self, schema: Any) -> str:
        schema = _arguments(schema)
        if self._config.disable_additional_properties:
            schema = process_for_additional_properties(schema)
        options = {"whitespace_flexible": not self._config.disable_any_whitespace}
        schema = {**schema, "x-guidance": {**options, **schema.get("x-guidance", {})}}
        return self._rule("%json " + json.dumps(schema, ensure_ascii=False))

    def expr(self, node: dict[str, Any]) -> str:
        kind = node["type"]
        if kind == "const_string":
            return _lark_literal(node["value"])
        if kind == "json_schema" and node.get("style", "json") == "json":
            return self._json(node["json_schema"])
        if kind == "tag":
            parts = [_lark_literal(node["begin"]), self.expr(node["content"])]
            return "(" + " ".join(p for p in [*parts, _lark_literal(node["end"])] if p) + ")"
        if kind == "sequence":
            return "(" + " ".join(self.expr(e) for e in node["elements"]) + ")"
        if kind == "or":
            return "(" + " | ".join(self.expr(e) for e in node["elements"]) + ")"
        if kind in ("optional", "plus", "star"):
            return (
                "("
                + self.expr(node["content"])
                + ")"
                + {"optional": "?", "plus": "+"}.get(kind, "*")
            )
        if kind == "tags_with_separator":
            one = self._rule(" | ".join(self.expr(t) for t in node["tags"]))
            if node.get("stop_after_first"):
                return one if node.get("at_least_one") else f"({one})?"
            many = f"{one} ({_lark_literal(node['separator'])} {one})*"
            return many if node.get("at_least_one") else f"({many})?"
        raise _Unsupported(f"the call format holds a {kind!r} part")


class _Unsupported(Exception):
    """A part of a structural tag the Lark lowering does not take."""


def _lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else ""


def _lark(tag: dict[str, Any], config: StructuredOutputsConfig) -> str:
    lark = _Lark(config)
    start = lark.expr(tag["format"])
    return "\n".join([f"start: {start}", *lark.rules])


def forced_call(
    outputs: StructuredOutputsParams, config: StructuredOutputsConfig, param: str
) -> Constraint | None:
    """The constraint vLLM's tool parser set on a request (`outputs`), lowered for the
    server's backend; None when it set none. Raises `InvalidRequest` naming `param` when
    the backend cannot enforce it."""
    if outputs.structural_tag is None and outputs.json is None:
        return None
    whitespace = not config.disable_any_whitespace
    try:
        if config.backend == "guidance":
            if outputs.structural_tag is None:  # a plain schema: any backend takes it
                return Constraint("json", _json_text(outputs.json), param)
            return Constraint("grammar", _lark(json.loads(outputs.structural_tag), config), param)
        if config.backend not in ("auto", "xgrammar"):
            raise _Unsupported("it takes no grammar of that kind")
        if outputs.structural_tag is not None:
            tag = _lower_tag(json.loads(outputs.structural_tag), whitespace)
            return Constraint("structural_tag", json.dumps(tag), param)
        return Constraint(
            "grammar", json_grammar(json.loads(_json_text(outputs.json)), whitespace), param
        )
    except _Unsupported as exc:
        raise InvalidRequest(
            f"{param}: the server's structured-output backend {config.backend!r} cannot "
            f"enforce this tool call ({exc}); xgrammar can",
            param=param,
        ) from exc
    except (ValueError, RuntimeError) as exc:
        raise InvalidRequest(f"{param} cannot be enforced: {exc}", param=param) from exc


def _json_text(schema: str | dict[str, Any] | None) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)
