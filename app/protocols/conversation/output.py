"""One choice's answer, read back from the engine's events: visible text and tool calls.

`ChoiceOutput` holds a choice's tool-call parser (the plan's, None when the call has no
tools to extract) and turns the choice's `TokenEvent`s into what every chat-shaped API
encodes in its own shape:

- streamed, `delta(event)` gives each event's `OutputDelta`: new text and tool-call
  pieces (a call's id and name once, with its first piece; argument fragments after),
  as the engine's parser reads them from the growing output;
- not streamed, `add(event)` collects, and `result()` parses the whole output once.

`finish(reason)` is the neutral finish of the choice: the engine's reason, except that
a choice that stopped after making calls finishes with "tool_calls" (each API maps it to
its own words; OpenAI Chat finishes a call its tool choice named with "stop", as `vllm
serve` does).

Invariant: the streamed pieces of a call concatenate to the arguments `result()` would
give for the same output (the engine's parser guarantees it; the OpenAI tool-parsing
tests hold it to `vllm serve`'s own serving layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.engine.base import FinishReason, TokenEvent
from app.engine.tools import ParsedOutput, ToolCallDelta, ToolCallParser

Finish = Literal["stop", "length", "abort", "tool_calls"]


@dataclass(frozen=True, slots=True)
class OutputDelta:
    text: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    reasoning: str = ""  # new reasoning text (a reasoning parser's; else never any)


@dataclass(slots=True)
class ChoiceOutput:
    parser: ToolCallParser | None
    called: bool = False  # a call was streamed or parsed
    _text: list[str] = field(default_factory=list)
    _token_ids: list[int] = field(default_factory=list)

    def delta(self, event: TokenEvent) -> OutputDelta:
        if self.parser is None:
            return OutputDelta(event.text)
        parsed = self.parser.feed(
            event.text,
            event.token_ids,
            prompt_token_ids=event.prompt_token_ids,
            finished=event.finish_reason is not None,
        )
        if parsed.tool_calls:
            self.called = True
        return OutputDelta(parsed.content or "", parsed.tool_calls, parsed.reasoning or "")

    def add(self, event: TokenEvent) -> None:
        self._text.append(event.text)
        if self.parser is not None:
            self._token_ids.extend(event.token_ids)

    def result(self) -> ParsedOutput:
        text = "".join(self._text)
        if self.parser is None:
            return ParsedOutput(text, ())
        parsed = self.parser.parse(text, self._token_ids)
        if parsed.tool_calls:
            self.called = True
        return parsed

    def finish(self, reason: FinishReason | None) -> Finish | None:
        if reason == "stop" and self.called:
            return "tool_calls"
        return reason
