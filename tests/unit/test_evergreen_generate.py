"""GENERATE's prompt building and config checks, and chunk refs, without an engine."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from google.protobuf import text_format

from app.errors import ContextLengthExceeded, InvalidRequest
from app.protocols.evergreen.generate import (
    Chunk,
    Turn,
    plan_action,
    prompt_token_ids,
    turns,
)
from app.protocols.evergreen.refs import FileRef, parse_ref
from schemas import evergreen_pb2 as pb
from tests.evergreen_frames import INFO, plan
from tests.fake_engine import FakeTokenizer

EOT = "application/x-protobuf; type=EndOfTurn"


def chunk(data: str | bytes, mimetype: str = "text/plain", role: str = "") -> Chunk:
    raw = data.encode() if isinstance(data, str) else data
    return Chunk("n", pb.ChunkMetadata(mimetype=mimetype, role=role), raw)


def test_roles_and_end_of_turn_make_turns() -> None:
    chunks = [
        chunk("Write a summary of "),
        chunk("this: laps"),
        chunk(b"", EOT),
        chunk("It is a race.", role="model"),
        chunk("Who wins?", "text/markdown", role="user"),
        chunk(b"", EOT),
        chunk(b"", EOT),  # an empty turn is no turn
    ]
    assert turns(chunks, INFO) == [
        Turn("user", "Write a summary of this: laps"),
        Turn("model", "It is a race."),
        Turn("user", "Who wins?"),
    ]


def test_end_of_turn_splits_two_turns_of_one_speaker() -> None:
    chunks = [chunk("one"), chunk(b"", "application/x-protobuf; type=evergreen.EndOfTurn")]
    assert turns([*chunks, chunk("two")], INFO) == [Turn("user", "one"), Turn("user", "two")]


def test_chat_template_gets_assistant_for_the_model_role() -> None:
    ids, sampling = prompt_token_ids(
        plan({"max_tokens": 3}),
        [chunk("hi"), chunk("hello", role="model"), chunk("bye")],
        FakeTokenizer(),
        INFO,
    )
    assert FakeTokenizer().decode(ids) == "[user]hi\n[assistant]hello\n[user]bye\n[assistant]"
    assert sampling.max_tokens == 3


def test_without_a_chat_template_text_is_concatenated() -> None:
    info = dataclasses.replace(INFO, has_chat_template=False)
    ids, sampling = prompt_token_ids(
        plan(), [chunk("a"), chunk(b"", EOT), chunk("b", role="model")], FakeTokenizer(), info
    )
    assert FakeTokenizer().decode(ids) == "ab"
    assert sampling.max_tokens == info.max_model_len - 2  # the rest of the context


@pytest.mark.parametrize("mimetype", ["image/png", "video/mp4", "application/x-protobuf"])
def test_a_type_the_model_cannot_take_is_named(mimetype: str) -> None:
    with pytest.raises(InvalidRequest, match=f"is '{mimetype}'.*takes text only"):
        turns([chunk("a"), chunk(b"\x89PNG", mimetype)], INFO)


def test_text_like_types_and_charsets() -> None:
    latex = chunk(r"\frac{1}{2}", "application/x-latex")
    latin = chunk("café".encode("latin-1"), "text/plain; charset=latin-1")
    assert turns([latex, latin], INFO) == [Turn("user", r"\frac{1}{2}café")]
    with pytest.raises(InvalidRequest, match="not valid utf-8"):
        turns([chunk(b"\xff")], INFO)
    with pytest.raises(InvalidRequest, match="unknown charset"):
        turns([chunk("a", "text/plain; charset=klingon")], INFO)
    with pytest.raises(InvalidRequest, match="not valid undefined"):  # was INTERNAL
        turns([chunk("a", "text/plain; charset=undefined")], INFO)


def test_no_text_and_too_long_prompts_abort() -> None:
    with pytest.raises(InvalidRequest, match="holds no text"):
        prompt_token_ids(plan(), [chunk(b"", EOT)], FakeTokenizer(), INFO)
    with pytest.raises(ContextLengthExceeded):
        prompt_token_ids(plan({"max_tokens": 1000}), [chunk("x" * 100)], FakeTokenizer(), INFO)
    with pytest.raises(ContextLengthExceeded):
        prompt_token_ids(plan(), [chunk("x" * 2000)], FakeTokenizer(), INFO)


def test_configs() -> None:
    p = plan({"maxTokens": 5, "top_p": 0.5, "topK": 3, "seed": 7, "stop_sequences": ["a", "b"]})
    assert p.max_tokens == 5
    assert (p.sampling.top_p, p.sampling.top_k, p.sampling.seed) == (0.5, 3, 7)
    assert p.sampling.stop == ("a", "b")
    assert plan(target="tiny-lora").lora_name == "tiny-lora"
    assert plan(target="tiny").lora_name is None
    cases: list[tuple[Any, str]] = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": "5"}, "must be a number"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": [1]}, "stop"),
        ({"max_tokens": 5, "max_output_tokens": 6}, "given twice"),
    ]
    for bad, match in cases:
        with pytest.raises(InvalidRequest, match=match):
            plan(bad)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_config_number_that_is_not_finite_is_invalid(value: float) -> None:
    # A binary Struct can carry them; JSON cannot, and json_format raised ValueError,
    # which the socket reported as INTERNAL instead of the client's INVALID_ARGUMENT.
    for config in ({"temperature": value}, {"stop": ["a", value]}):
        with pytest.raises(InvalidRequest, match="finite"):
            plan(config)


def test_a_config_struct_that_does_not_decode_is_invalid() -> None:
    # Any.Unpack raises on a corrupt payload (it returns False only for another type):
    # the socket reported it as INTERNAL.
    action = pb.Action(name="GENERATE")
    action.inputs.add(name="prompt", id="p")
    action.configs.add(type_url="type.googleapis.com/google.protobuf.Struct", value=b"\xff\xff")
    with pytest.raises(InvalidRequest, match="does not decode"):
        plan_action(action, INFO, lambda name: False)


def test_a_config_that_is_not_a_struct_is_refused() -> None:
    action = pb.Action(name="GENERATE")
    action.inputs.add(name="prompt", id="p")
    action.configs.add().Pack(pb.TargetSpec(id="x"))
    with pytest.raises(InvalidRequest, match=r"evergreen\.v2\.TargetSpec"):
        plan_action(action, INFO, lambda name: False)


def test_parameters_must_be_known_and_single() -> None:
    for text in [
        'name: "GENERATE"',
        'name: "GENERATE" inputs { name: "prompt" id: "a" } inputs { name: "text" id: "b" }',
        'name: "GENERATE" inputs { name: "prompt" id: "a" } inputs { name: "prompt" id: "b" }',
        'name: "GENERATE" inputs { name: "prompt" id: "a" } outputs { name: "image" id: "b" }',
        'name: "GENERATE" inputs { name: "prompt" id: "a" } '
        'outputs { name: "text" id: "b" } outputs { name: "response" id: "c" }',
    ]:
        with pytest.raises(InvalidRequest):
            plan_action(text_format.Parse(text, pb.Action()), INFO, lambda name: False)


def test_refs() -> None:
    assert parse_ref("data:,a%20b", files_allowed=False) == b"a b"
    assert parse_ref("DATA:;base64,aGk=", files_allowed=False) == b"hi"
    assert parse_ref("file://a/b.txt", True) == parse_ref("file:///a/./b.txt", True)
    assert parse_ref("file://a/b.txt", True) == FileRef("a/b.txt")
    for uri, allowed, match in [
        ("data:;base64,!!!", False, "bad base64"),
        ("data:abc", False, "','"),
        ("file://a", False, "off on this server"),
        ("file:/a", True, "starts with file://"),
        ("file://a/%2e%2e/%2e%2e/b", True, "leave the file root"),
        ("file://a?x=1", True, "no query"),
        ("file:///", True, "names no file"),
        ("http://example.invalid/x", True, "scheme 'http'"),
        ("just-a-name", True, "not a URI"),
    ]:
        with pytest.raises(InvalidRequest, match=match):
            parse_ref(uri, allowed)
