"""Tool calling in the engine seam: neutral types for a chat request's tools and the
calls a model made, and the `ToolSupport` an engine offers (`EngineInfo.tools`).

Which calls a model made is read from its text by the engine's own parser for the
model's format (for vLLM: the `--tool-call-parser` it ships), so the parser lives on the
engine side; the protocol cores only see these types. Neutral: no vLLM here.

Invariants:
- `ToolSupport.plan` checks the tools and the tool choice (raising `InvalidRequest`
  naming the client's field) and says which constraint, if any, forces the call, so
  `required` and named choices hold even on a random model.
- A `ToolCallParser` belongs to one choice of one request: `feed` is given that choice's
  deltas in order, `finished` on the last; `parse` is given a whole output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.engine.constraints import Constraint


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
    content: str | None
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class ParsedDelta:
    content: str | None
    tool_calls: tuple[ToolCallDelta, ...]


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
    """How one chat request uses its tools. `constraint` forces the call (None: the
    model is free); `new_parser()` gives each choice its parser (None: no extraction, the
    text stays content)."""

    constraint: Constraint | None
    new_parser: Callable[[], ToolCallParser] | None = field(default=None, compare=False)
    skip_special_tokens: bool | None = None  # set when the parser needs special tokens


class ToolSupport(Protocol):
    def plan(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool | None,
    ) -> ToolPlan: ...
