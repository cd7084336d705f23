"""JSON as xgrammar enforces it, corrected: the grammar of every JSON constraint on this
server when its structured-output backend is xgrammar (vLLM's `auto` picks it for these):
response formats (`json_schema`, `json_object`) and the arguments of forced tool calls
(`app.engine.vllm.call_grammar`). vLLM side of the seam.

xgrammar 0.2.8's JSON grammar admits text that is not JSON, or not the schema's:
- a string with `minLength`/`maxLength` is any character but `"`, `\\`, CR and LF
  repeated (mlc-ai/xgrammar#800): raw control characters (`\\x13`, a tab), which
  `json.loads` refuses ("Invalid control character"), and no escapes at all;
- every string admits UTF-8-encoded surrogates (bytes ED A0-BF xx): not UTF-8, they come
  back as three U+FFFD each, so a bounded string comes back over its bound;
- `\\u` escapes of surrogates, which `json.loads` reads into a string no UTF-8 encoder
  takes;
- with whitespace disabled, its arrays and objects of any values still separate items
  with ", " (mlc-ai/xgrammar#945, fixed after 0.2.8).

`json_grammar` is the EBNF xgrammar's own converter makes of a schema, with the server's
whitespace rule as vLLM passes it for `json` constraints, and those four corrected in its
text. `lowered` gives a response format that grammar, where vLLM would hand the schema to
xgrammar (never where vLLM falls back to guidance, nor on another backend).

Invariant (tests/unit/test_call_grammar.py walks the grammars byte by byte at random):
every text a corrected grammar admits parses with `json.loads`, is valid for the schema,
and holds no whitespace between tokens when the server disables it; it is UTF-8 too, but
in a string with a `pattern`: xgrammar matches those with its regex automaton, which takes
overlong and surrogate encodings (E0 9C 90, ED A0 80) for characters. Read back as U+FFFD
each, still JSON, they can take a bounded pattern over its bound; only a model that writes
bytes no text holds (a random one) meets it.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import xgrammar as xgr
from vllm.config import StructuredOutputsConfig
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import check_json_nesting
from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features

from app.engine.constraints import Constraint

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


def lowered(constraint: Constraint | None, config: StructuredOutputsConfig) -> Constraint | None:
    """`constraint` as this server enforces it: a JSON schema or JSON object, on xgrammar,
    becomes its corrected grammar (`param` kept); anything else as it is. A schema vLLM
    would not give xgrammar (features it lacks: vLLM's own check, and `auto` then falls
    back to guidance), too deep, or one xgrammar cannot convert is left to vLLM, whose
    checks then report it."""
    if constraint is None or constraint.kind not in ("json", "json_object"):
        return constraint
    if config.backend not in ("auto", "xgrammar"):
        return constraint
    spec = constraint.spec if constraint.kind == "json" else None
    grammar = _lowered_json(spec, not config.disable_any_whitespace)
    return constraint if grammar is None else Constraint("grammar", grammar, constraint.param)


@functools.lru_cache(maxsize=256)
def _lowered_json(spec: str | tuple[str, ...] | None, whitespace: bool) -> str | None:
    """The corrected grammar of a schema's text (None: any object), or None to leave it."""
    schema: Any = {"type": "object"}
    if spec is not None:
        try:
            check_json_nesting(str(spec))
            schema = json.loads(str(spec))
        except (ValueError, VLLMValidationError):
            return None
        if not isinstance(schema, dict) or has_xgrammar_unsupported_json_features(schema):
            return None
    try:
        return json_grammar(schema, whitespace)
    except (ValueError, RuntimeError):
        return None
