"""GENERATE, the action Evergreen sessions run on the engine. Sans-IO.

- `plan_action` validates an action when it arrives, before its inputs do: its name,
  its parameters (one input, `prompt` or `text`; at most one output, `response` or
  `text`), its configs and its target. Unknown names, configs or keys abort the session
  rather than being ignored: a typo must not silently change what is generated.
- Configs are `google.protobuf.Struct`s in `Action.configs` (a JSON-mappable generation
  config): max_tokens (alias max_output_tokens), temperature, top_p, top_k, seed, stop
  (alias stop_sequences), in snake_case or camelCase, within the limits every protocol
  shares (`app.engine.validation`; errors name the key as sent), and constraint: what
  the output must match, as vLLM's `structured_outputs` names it (exactly one of json,
  regex, choice, grammar, json_object; e.g. `{"constraint": {"regex": "[0-9]+"}}`).
  Without max_tokens, generation may use the rest of the context, as an OpenAI chat
  completion does.
- `target_spec.id` is empty or the served model's name (the base model), or the name of
  a loaded LoRA adapter; anything else is NOT_FOUND (`app.engine.models`, the one lookup).
- `prompt_token_ids` turns the flattened input into a prompt. Text chunks (`text/*` and
  `application/x-latex`, decoded by their `charset`, UTF-8 by default) are text;
  `application/x-protobuf; type=EndOfTurn` ends a turn; a chunk's `role` names the
  turn's speaker (empty: `user`; the server's own outputs are `model`, which chat
  templates call `assistant`), and a change of role starts a new turn. With a chat
  template the turns are chat messages, with a generation prompt after them; without
  one the text is concatenated. Any other type aborts, naming it.
- The output is one text node: `OUTPUT_METADATA` on seq 0, then the text as the engine
  produces it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import DecodeError

from app.engine.base import (
    ChatMessage,
    ChatPrompt,
    EngineInfo,
    SamplingOptions,
    TextPart,
    Tokenizer,
)
from app.engine.constraints import Constraint, parse_constraint
from app.engine.models import resolve_model
from app.engine.validation import check_prompt, validate_sampling
from app.errors import InvalidRequest
from schemas import evergreen_pb2 as pb

ACTION = "GENERATE"
INPUT_NAMES = ("prompt", "text")
OUTPUT_NAMES = ("response", "text")
OUTPUT_METADATA = pb.ChunkMetadata(mimetype="text/plain", role="model")
_TEXT_LIKE = frozenset({"application/x-latex"})
_CHAT_ROLES = {"model": "assistant"}
_CONFIG_ALIASES = {
    "max_tokens": "max_tokens",
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop": "stop",
    "stop_sequences": "stop",
    "constraint": "constraint",
}
_STRUCT = struct_pb2.Struct.DESCRIPTOR.full_name


@dataclass(frozen=True, slots=True)
class GeneratePlan:
    input_ids: tuple[str, ...]  # (the prompt's root,)
    output_ids: tuple[str, ...]  # () or (the response's root,)
    input_name: str
    sampling: SamplingOptions
    max_tokens: int | None  # None: the rest of the context
    lora_name: str | None  # None: the base model
    fields: Mapping[str, str]  # neutral name -> how errors name it (the client's key)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One flattened input chunk with its payload read."""

    node_id: str
    metadata: pb.ChunkMetadata
    data: bytes


@dataclass(frozen=True, slots=True)
class Turn:
    role: str
    text: str


def plan_action(
    action: pb.Action, info: EngineInfo, has_model: Callable[[str], bool]
) -> GeneratePlan:
    if action.name != ACTION:
        raise InvalidRequest(f"action {action.name!r} is not supported; this server runs {ACTION}")
    inputs = _parameters(action.inputs, INPUT_NAMES, "input")
    outputs = _parameters(action.outputs, OUTPUT_NAMES, "output")
    if len(inputs) != 1:
        raise InvalidRequest(f"{ACTION} takes exactly one input, named one of {INPUT_NAMES}")
    if len(outputs) > 1:
        raise InvalidRequest(f"{ACTION} has one output; name it one of {OUTPUT_NAMES}")
    config = _config(action.configs)
    # Errors of the shared limits name the key as the client wrote it.
    fields = {name: f"{ACTION} config {key!r}" for name, (key, _) in config.items()}
    max_tokens = _config_int(config, "max_tokens")
    options = SamplingOptions(
        # Without max_tokens, the rest of the context: known once the prompt is.
        max_tokens=max_tokens if max_tokens is not None else 1,
        temperature=_config_float(config, "temperature", 1.0),
        top_p=_config_float(config, "top_p", 1.0),
        top_k=_config_int(config, "top_k") or 0,
        seed=_config_int(config, "seed"),
        stop=_config_stop(config),
        constraint=_config_constraint(config),
    )
    sampling = validate_sampling(options, info, fields)
    lora_name = resolve_model(action.target_spec.id, info.model_name, has_model).lora_name
    (input_name, input_id), *_ = inputs.items()
    return GeneratePlan(
        input_ids=(input_id,),
        output_ids=tuple(outputs.values()),
        input_name=input_name,
        sampling=sampling,
        max_tokens=max_tokens,
        lora_name=lora_name,
        fields=fields,
    )


def _parameters(
    parameters: Sequence[pb.NamedParameter], names: tuple[str, ...], kind: str
) -> dict[str, str]:
    out: dict[str, str] = {}
    for parameter in parameters:
        if parameter.name not in names:
            raise InvalidRequest(
                f"{ACTION} has no {kind} named {parameter.name!r}; its {kind}s: {names}"
            )
        if parameter.name in out:
            raise InvalidRequest(f"{ACTION} {kind} {parameter.name!r} is named twice")
        out[parameter.name] = parameter.id
    return out


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


Config = dict[str, tuple[str, object]]  # neutral name -> (the client's key, its value)


def _config(configs: Sequence[Any]) -> Config:
    merged: Config = {}
    for config in configs:
        type_name = config.TypeName()
        if type_name != _STRUCT:
            raise InvalidRequest(
                f"{ACTION} config of type {type_name!r} is not supported; send a {_STRUCT}"
            )
        struct = struct_pb2.Struct()
        try:
            config.Unpack(struct)  # the type was checked above; a bad payload raises
        except DecodeError as exc:
            raise InvalidRequest(f"{ACTION} config: the {_STRUCT} does not decode: {exc}") from exc
        try:
            values = json_format.MessageToDict(struct)
        except ValueError as exc:  # NaN or an infinity: JSON has no such number
            raise InvalidRequest(f"{ACTION} config numbers must be finite: {exc}") from exc
        for key, value in values.items():
            name = _CONFIG_ALIASES.get(_snake(key))
            if name is None:
                raise InvalidRequest(
                    f"{ACTION} config key {key!r} is not supported; keys: "
                    f"{sorted(set(_CONFIG_ALIASES))}"
                )
            if name in merged:
                raise InvalidRequest(f"{ACTION} config {name!r} is given twice")
            merged[name] = (key, value)
    return merged


def _config_constraint(config: Config) -> Constraint | None:
    entry = config.get("constraint")
    if entry is None:
        return None
    key, value = entry
    return parse_constraint(value, key)


# Types only: the ranges are the shared ones (`app.engine.validation`).
def _config_number(config: Config, name: str) -> float | None:
    if name not in config:
        return None
    key, value = config[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{ACTION} config {key!r} must be a number, not {value!r}")
    return float(value)


def _config_int(config: Config, name: str) -> int | None:
    value = _config_number(config, name)
    if value is None:
        return None
    if not value.is_integer():
        raise InvalidRequest(f"{ACTION} config {config[name][0]!r} must be an integer")
    return int(value)


def _config_float(config: Config, name: str, default: float) -> float:
    value = _config_number(config, name)
    return default if value is None else value


def _config_stop(config: Config) -> tuple[str, ...]:
    if "stop" not in config:
        return ()
    key, value = config["stop"]
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest(f"{ACTION} config {key!r} must be a string or a list of strings")
    return tuple(stops)


def _mimetype(value: str) -> tuple[str, dict[str, str]]:
    base, *params = value.split(";")
    parsed: dict[str, str] = {}
    for param in params:
        key, _, val = param.partition("=")
        parsed[key.strip().lower()] = val.strip().strip('"')
    return base.strip().lower(), parsed


def _is_end_of_turn(base: str, params: dict[str, str]) -> bool:
    kind = params.get("type", "")
    return base == "application/x-protobuf" and kind.rpartition(".")[2] == "EndOfTurn"


def turns(chunks: Sequence[Chunk], info: EngineInfo) -> list[Turn]:
    out: list[Turn] = []
    role: str | None = None
    texts: list[str] = []

    def flush() -> None:
        nonlocal role
        if role is not None:
            out.append(Turn(role, "".join(texts)))
        role = None
        texts.clear()

    for chunk in chunks:
        base, params = _mimetype(chunk.metadata.mimetype)
        if _is_end_of_turn(base, params):
            flush()
            continue
        if not (base.startswith("text/") or base in _TEXT_LIKE):
            raise InvalidRequest(
                f"{ACTION}: node {chunk.node_id!r} is {chunk.metadata.mimetype!r}, and the "
                f"model {info.model_name!r} takes text only"
            )
        charset = params.get("charset", "utf-8")
        try:
            text = chunk.data.decode(charset)
        except LookupError as exc:
            raise InvalidRequest(f"node {chunk.node_id!r}: unknown charset {charset!r}") from exc
        except UnicodeError as exc:  # not only UnicodeDecodeError: the 'undefined' codec
            raise InvalidRequest(f"node {chunk.node_id!r}: not valid {charset}: {exc}") from exc
        speaker = chunk.metadata.role or "user"
        if role is not None and speaker != role:
            flush()
        role = speaker
        texts.append(text)
    flush()
    return out


def prompt_token_ids(
    plan: GeneratePlan, chunks: Sequence[Chunk], tokenizer: Tokenizer, info: EngineInfo
) -> tuple[list[int], SamplingOptions]:
    """The prompt, and the sampling options with max_tokens fitted to the context."""
    conversation = turns(chunks, info)
    if not conversation:
        raise InvalidRequest(f"{ACTION}: input {plan.input_name!r} holds no text")
    if info.has_chat_template:
        messages = tuple(
            ChatMessage(role=_CHAT_ROLES.get(t.role, t.role), parts=(TextPart(t.text),))
            for t in conversation
        )
        ids = tokenizer.apply_chat_template(ChatPrompt(messages))
    else:
        ids = tokenizer.encode("".join(t.text for t in conversation))
    max_tokens = plan.max_tokens if plan.max_tokens is not None else info.max_model_len - len(ids)
    check_prompt(
        ids, max_tokens, info, {**plan.fields, "prompt": f"{ACTION} input {plan.input_name!r}"}
    )
    return ids, replace(plan.sampling, max_tokens=max_tokens)
