"""Tool calling in the engine seam: neutral types for the tools a chat call offers, the
calls a model made, and the `ToolSupport` an engine offers (`EngineInfo.tools`), whose
parsers also read a reasoning model's reasoning out of its text when the engine has a
reasoning parser.

Which calls a model made is read from its text by the engine's own parser for the
model's format (for vLLM: the `--tool-call-parser` it ships), so the parser lives on the
engine side; the protocol cores only see these types. Neutral: no vLLM here, and no
API's shape: each chat-shaped API (OpenAI Chat, Responses, Anthropic Messages) maps its
own tool fields onto `ToolSpec` and `ToolChoice`.

Invariants:
- `ToolSupport.plan` checks the tools and the tool choice (raising `InvalidRequest`
  naming `ToolFields`' names for the client's fields) and says which constraint, if any,
  forces the call, so `required` and named choices hold even on a random model; it also
  gives the tools as the model's chat template must see them (`ToolPlan.template_tools`).
- A `ToolCallParser` belongs to one choice of one request: `feed` is given that choice's
  deltas in order, `finished` on the last; `parse` is given a whole output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from app.engine.constraints import Constraint


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: its JSON schema `parameters` (None: no
    parameters), and `strict` (None: unsaid) asks that forced arguments match it."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class NamedTool:
    """A tool choice that forces one call of the tool `name`."""

    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedTool


@dataclass(frozen=True, slots=True)
class ToolFields:
    """The client's names for the tool fields, for errors (`param`)."""

    tools: str = "tools"
    tool_choice: str = "tool_choice"


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed call: `id` and `name` come once, with the call's first
    piece; `arguments` are fragments to append."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A whole output, read: its visible text, its calls, and its reasoning (the text a
    reasoning model thinks in, when a reasoning parser reads it; None otherwise)."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    reasoning: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedDelta:
    content: str | None
    tool_calls: tuple[ToolCallDelta, ...]
    reasoning: str | None = None


class ToolCallParser(Protocol):
    def parse(self, text: str, token_ids: Sequence[int]) -> ParsedOutput: ...

    def feed(
        self,
        text: str,
        token_ids: Sequence[int],
        *,
        prompt_token_ids: Sequence[int] | None,
        finished: bool,
    ) -> ParsedDelta:
        """`prompt_token_ids` with the first delta (None after it)."""
        ...


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How one chat call uses its tools. `constraint` forces the call (None: the model
    is free); `new_parser()` gives each choice its parser (None: no extraction, the text
    stays content); `template_tools` are the tools as the chat template renders them
    (None: no tools in the prompt)."""

    constraint: Constraint | None = None
    new_parser: Callable[[], ToolCallParser] | None = field(default=None, compare=False)
    skip_special_tokens: bool | None = None  # set when the parser needs special tokens
    template_tools: tuple[Mapping[str, Any], ...] | None = None


class ToolSupport(Protocol):
    def plan(
        self,
        tools: Sequence[ToolSpec],
        tool_choice: ToolChoice | None,
        parallel_tool_calls: bool | None,
        fields: ToolFields,
        constraint: Constraint | None,
        template_kwargs: Mapping[str, object],
    ) -> ToolPlan:
        """The plan for `tools` (`tool_choice` None: "auto" with tools, as OpenAI's
        default), asked of every conversation, tools or not: with a reasoning parser the
        plan's parser also reads reasoning out of the text. `constraint` is what the call
        asks of its output besides (a response format): the plan's constraint, when it
        has one, already accounts for it (an `auto` choice may combine both; a forced
        call overrides it), and None leaves `constraint` in force. `template_kwargs` are
        the chat template's (a reasoning parser may read its thinking switch). Raises
        `InvalidRequest` naming `fields`."""
        ...
