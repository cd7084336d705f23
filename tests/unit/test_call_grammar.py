"""The constraint a forced tool call runs under (`app/engine/vllm/call_grammar.py`), walked
byte by byte at random: every text it admits is read back by vLLM's hermes parser as calls
whose arguments are JSON valid for the tool's schema, whole and streamed, with no
whitespace the server's config forbids.

No engine: xgrammar's own matcher, over a vocabulary of the 256 bytes and an end token,
draws each next byte uniformly among those the grammar allows (the end, when allowed, with
a fixed chance). Raw control characters, escapes, multi-byte and surrogate encodings all
come up within a few dozen walks; xgrammar's uncorrected grammar fails them (held below,
so that a release that fixes it is noticed, and the correction can go).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np
import pytest
import xgrammar as xgr
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from vllm.config import StructuredOutputsConfig

from app.engine.constraints import Constraint
from app.engine.tools import NamedTool, ToolFields, ToolSpec
from app.engine.vllm.json_grammar import json_grammar, lowered
from app.errors import InvalidRequest
from tests.conftest import tiny_model_path
from tests.fake_engine import vllm_tool_support
from tests.json_text import whitespace_outside_strings

_VOCAB = [bytes([i]) for i in range(256)] + [b"<end>"]
_END = 256
WALKS = 120

BOUNDED = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
SCHEMAS: list[dict[str, Any]] = [
    BOUNDED,
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 6},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
            "n": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["name", "tags", "n"],
    },
    {"type": "object", "properties": {"free": {"type": "string"}}, "required": ["free"]},
    {"type": "object", "properties": {"any": {}, "list": {"type": "array"}}, "required": ["any"]},
    {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4}},
    {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}},
]


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    info = xgr.TokenizerInfo(_VOCAB, xgr.VocabType.RAW, stop_token_ids=[_END])
    return xgr.GrammarCompiler(info, cache_enabled=False)


def walks(grammar: xgr.CompiledGrammar, seed: int, count: int = WALKS) -> Iterator[bytes]:
    """`count` random texts `grammar` admits whole (walks that run past 800 bytes are
    dropped: an unbounded string or array)."""
    rng = random.Random(seed)
    mask = xgr.allocate_token_bitmask(1, len(_VOCAB))
    packed = mask.numpy().view(np.uint8)  # the mask's own memory, refilled at each step
    for _ in range(count):
        matcher = xgr.GrammarMatcher(grammar)
        out = bytearray()
        while len(out) < 800:
            matcher.fill_next_token_bitmask(mask)
            bits = np.unpackbits(packed[0], bitorder="little")
            allowed = np.flatnonzero(bits[: len(_VOCAB)])
            can_end = allowed[-1] == _END
            if can_end and (len(allowed) == 1 or rng.random() < 0.3):
                yield bytes(out)
                break
            token = int(allowed[rng.randrange(len(allowed) - can_end)])
            assert matcher.accept_token(token)
            out += _VOCAB[token]
            if matcher.is_terminated():
                yield bytes(out)
                break


@cache
def _validator(schema: str) -> Validator:
    """A validator of the JSON `schema`, its schema checked once (`jsonschema.validate`
    checks it on every call: half of these tests' time)."""
    loaded = json.loads(schema)
    kind = validator_for(loaded)
    kind.check_schema(loaded)
    return kind(loaded)


def check_json(text: bytes, schema: dict[str, Any], whitespace: bool) -> Any:
    decoded = text.decode()  # strict: surrogate and overlong encodings fail here
    value = json.loads(decoded)  # strict: raw control characters fail here
    json.dumps(value, ensure_ascii=False).encode()  # `\u` escapes of lone surrogates
    _validator(json.dumps(schema, sort_keys=True)).validate(value)
    assert whitespace or not whitespace_outside_strings(decoded), decoded
    return value


@pytest.mark.parametrize("whitespace", [False, True])
@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_json_grammar_admits_only_json_valid_for_the_schema(
    compiler: xgr.GrammarCompiler, index: int, whitespace: bool
) -> None:
    schema = SCHEMAS[index]
    grammar = compiler.compile_grammar(json_grammar(schema, whitespace))
    texts = list(walks(grammar, seed=index))
    assert len(texts) > WALKS // 2
    for text in texts:
        check_json(text, schema, whitespace)


def admits(grammar: xgr.CompiledGrammar, text: bytes) -> bool:
    matcher = xgr.GrammarMatcher(grammar)
    return bool(matcher.accept_string(text) and matcher.is_completed())


# (text, xgrammar's own grammar admits it, the corrected one does): what each correction
# changes, on the bounded schema (and generic values for the separator).
CORRECTIONS = [
    (b'{"city":"a\x13b"}', True, False),  # a raw control character in a bounded string
    (b'{"city":"a\tb"}', True, False),
    (b'{"city":"a\\nb"}', False, True),  # an escape in a bounded string
    (b'{"city":"\\u00e9"}', False, True),
    (b'{"city":"\xed\xa0\x80"}', True, False),  # a surrogate, UTF-8-encoded
    (b'{"city":"\\ud800"}', False, False),  # (refused by both: an escape of one)
    (b'{"city":"ab"}', True, True),
]


@pytest.mark.parametrize(("text", "by_xgrammar", "corrected"), CORRECTIONS)
def test_what_the_corrections_change(
    compiler: xgr.GrammarCompiler, text: bytes, by_xgrammar: bool, corrected: bool
) -> None:
    schema = json.dumps(BOUNDED)
    own = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    assert admits(own, text) is by_xgrammar
    assert admits(compiler.compile_grammar(json_grammar(BOUNDED, False)), text) is corrected


# The same on a schema of any value: what xgrammar's generic values admit.
GENERIC = [
    (b'{"v":"\\udc00"}', True, False),  # an escape of a surrogate
    (b'{"v":"\\u20ac"}', True, True),
    (b'{"v":[1, 2]}', True, False),  # ", " between items: no compact form at all
    (b'{"v":[1,2]}', False, True),
    (b'{"v":{"a":1, "b":2}}', True, False),
    (b'{"v":{"a":1,"b":2}}', False, True),
]


@pytest.mark.parametrize(("text", "by_xgrammar", "corrected"), GENERIC)
def test_what_the_corrections_change_in_any_value(
    compiler: xgr.GrammarCompiler, text: bytes, by_xgrammar: bool, corrected: bool
) -> None:
    schema = {"type": "object", "properties": {"v": {}}, "required": ["v"]}
    own = compiler.compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":")
    )
    assert admits(own, text) is by_xgrammar
    assert admits(compiler.compile_grammar(json_grammar(schema, False)), text) is corrected


TOOLS = (
    ToolSpec("get_weather", parameters=BOUNDED, strict=True),
    ToolSpec("note", parameters={"type": "object", "properties": {"text": {"type": "string"}}}),
)


def support(**config: Any) -> Any:
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(tiny_model_path()))
    return vllm_tool_support(tokenizer, str(tiny_model_path()), StructuredOutputsConfig(**config))


CHOICES = [("required", None), ("required", False), (NamedTool("get_weather"), None)]


def read_back(plan: Any, output: str, choice: Any, parallel: bool | None, seed: int) -> None:
    """The constraint and the parser agree: `output` (a text the constraint admitted) is
    read back, whole and streamed at random cuts, as calls of the offered tools, the
    strict one's arguments valid for its schema, every call's an object, and the streamed
    arguments (the model's own text) with no whitespace outside strings."""
    names = {"get_weather"} if isinstance(choice, NamedTool) else {t.name for t in TOOLS}
    parsed = plan.new_parser().parse(output, [])
    assert parsed.tool_calls, output
    if parallel is False or isinstance(choice, NamedTool):
        assert len(parsed.tool_calls) == 1
    for call in parsed.tool_calls:
        assert call.name in names
        schema = BOUNDED if call.name == "get_weather" else {"type": "object"}
        check_json(call.arguments.encode(), schema, whitespace=True)
    parser = plan.new_parser()
    cuts = sorted(random.Random(seed).sample(range(1, len(output)), min(6, len(output) - 1)))
    pieces = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)], strict=True)]
    streamed: dict[int, list[str]] = {}
    for i, piece in enumerate(pieces):
        first, last = i == 0, i == len(pieces) - 1
        delta = parser.feed(piece, [], prompt_token_ids=[] if first else None, finished=last)
        for d in delta.tool_calls:
            entry = streamed.setdefault(d.index, ["", ""])
            entry[0] += d.name or ""
            entry[1] += d.arguments or ""
    whole = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    assert [(n, json.loads(a)) for n, a in streamed.values()] == whole, output
    for _, arguments in streamed.values():
        assert not whitespace_outside_strings(arguments), output


@pytest.mark.parametrize(("choice", "parallel"), CHOICES)
def test_xgrammar_forced_calls_are_read_back_by_the_parser(
    compiler: xgr.GrammarCompiler, choice: Any, parallel: bool | None
) -> None:
    tools = support(backend="xgrammar", disable_any_whitespace=True)
    plan = tools.plan(TOOLS, choice, parallel, ToolFields(), None, {})
    assert plan.constraint is not None and plan.constraint.kind == "structural_tag"
    assert '"json_schema"' not in str(plan.constraint.spec)  # every schema lowered
    grammar = compiler.compile_structural_tag(str(plan.constraint.spec))
    texts = list(walks(grammar, seed=3, count=60))
    assert len(texts) >= 30  # (walks past 800 bytes dropped: calls without end)
    for i, text in enumerate(texts):
        read_back(plan, text.decode(), choice, parallel, seed=i)


@pytest.fixture(scope="module")
def llguidance_tokenizer() -> Any:
    from llguidance.hf import from_tokenizer
    from transformers import AutoTokenizer

    return from_tokenizer(AutoTokenizer.from_pretrained(str(tiny_model_path())))


def guidance_walks(grammar: str, tokenizer: Any, seed: int, count: int) -> Iterator[str]:
    """As `walks`, with llguidance's matcher over the tiny model's own tokens."""
    import llguidance

    rng = random.Random(seed)
    eos = tokenizer.eos_token
    for _ in range(count):
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        tokens: list[int] = []
        while len(tokens) < 300 and not matcher.is_stopped():
            bits = np.unpackbits(
                np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little"
            )
            allowed = np.flatnonzero(bits[: tokenizer.vocab_size])
            allowed = allowed[allowed != eos]
            if matcher.is_accepting() and (not len(allowed) or rng.random() < 0.3):
                yield tokenizer.decode_str(tokens)
                break
            tokens.append(int(rng.choice(allowed)))
            assert matcher.consume_token(tokens[-1]), matcher.get_error()
        else:
            if matcher.is_stopped():
                yield tokenizer.decode_str(tokens)


@pytest.mark.parametrize(("choice", "parallel"), CHOICES)
def test_guidance_forced_calls_are_read_back_by_the_parser(
    llguidance_tokenizer: Any, choice: Any, parallel: bool | None
) -> None:
    """The guidance backend: the tag as Lark, schemas inline, read back the same."""
    import llguidance

    tools = support(backend="guidance", disable_any_whitespace=True)
    plan = tools.plan(TOOLS, choice, parallel, ToolFields(), None, {})
    assert plan.constraint is not None and plan.constraint.kind == "grammar"
    grammar = llguidance.grammar_from("grammar", str(plan.constraint.spec))
    assert llguidance.LLMatcher.validate_grammar(grammar, llguidance_tokenizer) == ""
    texts = list(guidance_walks(grammar, llguidance_tokenizer, seed=5, count=40))
    assert len(texts) >= 20
    for i, text in enumerate(texts):
        read_back(plan, text, choice, parallel, seed=i)


def test_a_non_strict_tools_arguments_are_an_object() -> None:
    tools = support(backend="xgrammar")
    plan = tools.plan(TOOLS[1:], "required", None, ToolFields(), None, {})
    tag = json.loads(str(plan.constraint.spec))
    grammars = [t["content"]["grammar"] for t in tag["format"]["tags"]]
    assert grammars and all(g == json_grammar({"type": "object"}, True) for g in grammars)


@pytest.mark.parametrize(
    ("backend", "choice", "tools"),
    [
        ("outlines", "required", TOOLS),
        ("lm-format-enforcer", NamedTool("note"), TOOLS),
        ("guidance", "auto", TOOLS),  # auto over a strict tool: a triggered tag
    ],
)
def test_a_backend_that_cannot_force_a_call_is_a_400(
    backend: str, choice: Any, tools: tuple[ToolSpec, ...]
) -> None:
    support_ = support(backend=backend)
    fields = ToolFields(tool_choice="tool_choice")
    with pytest.raises(InvalidRequest) as raised:
        support_.plan(tools, choice, None, fields, None, {})
    assert raised.value.param == "tool_choice" and backend in raised.value.message
    # auto over tools that are not strict forces nothing: any backend serves it
    assert support_.plan(TOOLS[1:], "auto", None, fields, None, {}).constraint is None


def test_a_response_format_on_xgrammar_is_its_corrected_grammar() -> None:
    """Response formats get the same corrected JSON (`lowered`, where the engine runs a
    constraint and where it checks one); what vLLM would not give xgrammar is left to it."""
    config = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
    schema = Constraint("json", json.dumps(BOUNDED), "response_format")
    assert lowered(schema, config) == Constraint(
        "grammar", json_grammar(BOUNDED, False), "response_format"
    )
    any_object = lowered(Constraint("json_object", None, "p"), StructuredOutputsConfig())
    assert any_object == Constraint("grammar", json_grammar({"type": "object"}, True), "p")
    multiple_of = Constraint("json", json.dumps({"type": "integer", "multipleOf": 3}), "p")
    for constraint, other in [
        (schema, StructuredOutputsConfig(backend="guidance")),
        (multiple_of, config),  # a feature xgrammar lacks: `auto` falls back to guidance
        (Constraint("regex", "a+", "p"), config),
    ]:
        assert lowered(constraint, other) is constraint
