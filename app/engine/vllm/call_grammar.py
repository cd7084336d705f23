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
2. xgrammar 0.2.8's JSON grammar admits text that is not JSON, or not the schema's:
   - a string with `minLength`/`maxLength` is any character but `"`, `\\`, CR and LF
     repeated (mlc-ai/xgrammar#800): raw control characters (`\\x13`, `\\t`), which
     `json.loads` refuses ("Invalid control character"), and no escapes at all;
   - every string admits UTF-8-encoded surrogates (bytes ED A0-BF xx): not UTF-8, they
     come back as three U+FFFD each, so a bounded string comes back over its bound;
   - `\\u` escapes of surrogates, which `json.loads` reads into a string no UTF-8
     encoder takes;
   - with whitespace disabled, its arrays and objects of any values still separate items
     with ", " (mlc-ai/xgrammar#945, fixed after 0.2.8).
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

Invariant (tests/unit/test_call_grammar.py walks the grammars byte by byte at random):
every text a lowered JSON grammar admits parses with `json.loads`, is valid for the
schema, and holds no whitespace outside strings when the server disables it; it is UTF-8
too, but in a string with a `pattern`: xgrammar matches those with its regex automaton,
which takes overlong and surrogate encodings (E0 9C 90, ED A0 80) for characters. Read
back as U+FFFD each, still JSON, they can take a bounded pattern over its bound; only a
model that writes bytes no text holds (a random one) meets it.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import xgrammar as xgr
from vllm.config import StructuredOutputsConfig
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.structured_output.backend_guidance import process_for_additional_properties

from app.engine.constraints import Constraint
from app.errors import InvalidRequest

# Code points no JSON string may hold raw (controls) or as UTF-8 at all (surrogates),
# as xgrammar's character classes write them.
_NEVER_RAW = (r"\0-\x1f", r"\ud800-\udfff")
_HEX = "[A-Fa-f0-9]"
# xgrammar 0.2.8's escape rule, and the same without `\u` escapes of surrogates (D800-DFFF).
_ESCAPE = f'basic_escape ::= (([\\"\\\\/bfnrt]) | ("u" {_HEX} {_HEX} {_HEX} {_HEX}))'
_ESCAPE_NO_SURROGATES = (
    f'basic_escape ::= (([\\"\\\\/bfnrt]) | ("u" [0-9A-Ca-cE-Fe-f] {_HEX} {_HEX} {_HEX})'
    f' | ("u" [Dd] [0-7] {_HEX} {_HEX}))'
)
# A bounded string's one character: a lone negated class (after `_classes`), to which
# the escapes are added.
_BOUNDED_CHARACTER = re.compile(r"^(\w+_characters) ::= \(\((\[\^[^\n]*\])\)\)$", re.M)
# The generic arrays' and objects' separators: ", " (xgrammar#945) becomes ","
_LOOSE_SEPARATOR = re.compile(r'^(basic_array_items|basic_object_properties) ::= \(\(", " ', re.M)


def _literal_end(text: str, start: int, close: str) -> int:
    """The index just past the `close` that ends the literal or class opened at `start`
    (backslash escapes skipped)."""
    i = start + 1
    while text[i] != close:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _classes(ebnf: str) -> str:
    """Every negated class (in this grammar, only ever a string's characters) also
    excludes controls and surrogates. (A string `pattern` is a `Regex(...)` rule, whose
    literal is skipped like any other.)"""
    out = []
    i = 0
    while i < len(ebnf):
        c = ebnf[i]
        if c == '"':
            end = _literal_end(ebnf, i, '"')
            out.append(ebnf[i:end])
            i = end
        elif c == "[":
            end = _literal_end(ebnf, i, "]")
            body = ebnf[i:end]
            if body.startswith("[^"):
                body = body[:-1] + "".join(r for r in _NEVER_RAW if r not in body) + "]"
            out.append(body)
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _json_grammar(schema: str, whitespace: bool) -> str:
    grammar = xgr.Grammar.from_json_schema(
        schema,
        any_whitespace=whitespace,
        separators=None if whitespace else (",", ":"),
        strict_mode=True,  # as xgrammar compiles a structural tag's schemas
    )
    ebnf = _classes(str(grammar)).replace(_ESCAPE, _ESCAPE_NO_SURROGATES)
    ebnf = _BOUNDED_CHARACTER.sub(r'\1 ::= ((\2) | ("\\\\" basic_escape))', ebnf)
    if not whitespace:
        ebnf = _LOOSE_SEPARATOR.sub(r'\1 ::= (("," ', ebnf)
    return ebnf


def json_grammar(schema: Any, whitespace: bool) -> str:
    """xgrammar's EBNF for `schema` (a JSON schema, or True: any value), corrected as the
    module says; `whitespace` False: none between JSON tokens. Raises ValueError (or
    RuntimeError) for a schema xgrammar cannot convert."""
    # Key order kept: xgrammar has the model write properties in the schema's order.
    text = json.dumps(schema if schema is not True else {})
    return _json_grammar(text, whitespace)


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
