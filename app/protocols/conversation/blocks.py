"""An answer's output cut into blocks as it streams, once for every API that streams
blocks: the Responses API's output items and Messages' content blocks.

A block holds one kind of output: reasoning, text, or one tool call. The open block grows
while the output keeps its kind; a piece of another kind, or of another call, closes it
and opens the next. So blocks never interleave, each call is one block (opened with its
id and name, which come with its first piece), and the blocks' order is the output's.
Each `OutputDelta` is walked in one order: its reasoning, its text, its calls by their
index (a parser may hand a call's last piece on beside the next call's first).

`OutputBlocks` is that state machine; an API's exchange extends it and writes each step as
its own events (`opened`, `grew_*`, `closed`), appending them to the list it is given.
`open_index` is the open block's place among the answer's blocks, counted from 0 in the
order they opened (Responses' `output_index`, Messages' `index`).

The per-token path is a kind comparison and one call into the exchange; nothing is built
here (`write_output` hands an answer no parser reads straight on as text).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

from app.engine.base import TokenEvent
from app.engine.tools import ToolCallDelta
from app.protocols.conversation.output import ChoiceOutput, OutputDelta
from app.protocols.exchange import Event

Kind = Literal["reasoning", "text", "call"]


class OutputBlocks(ABC):
    def __init__(self) -> None:
        self.open_kind: Kind | None = None
        self.open_index = -1
        self.blocks = 0  # opened so far
        self._open_call = -1  # the open call's index among the parser's calls

    def write_output(self, output: ChoiceOutput, event: TokenEvent, out: list[Event]) -> None:
        """`event`'s output, read by `output`'s parser (none: the text is the answer, the
        common case, which builds nothing on its way)."""
        if output.parser is None:
            if event.text:
                self.write_text(event.text, event, out)
            return
        self.write_delta(output.delta(event), event, out)

    def write_delta(self, delta: OutputDelta, event: TokenEvent, out: list[Event]) -> None:
        """Every step `delta` (of `event`) makes, written to `out`."""
        if delta.reasoning:
            if self.open_kind != "reasoning":
                self.open_block("reasoning", None, out)
            self.grew_reasoning(delta.reasoning, out)
        if delta.text:
            self.write_text(delta.text, event, out)
        calls = delta.tool_calls
        if len(calls) > 1:  # a call's last piece may come beside the next call's first
            calls = tuple(sorted(calls, key=lambda call: call.index))
        for call in calls:
            if self.open_kind != "call" or self._open_call != call.index:
                self.open_block("call", call, out)
                self._open_call = call.index
            if call.arguments:
                self.grew_call(call.arguments, out)

    def write_text(self, text: str, event: TokenEvent, out: list[Event]) -> None:
        """Visible text (all of an answer that no parser reads)."""
        if self.open_kind != "text":
            self.open_block("text", None, out)
        self.grew_text(text, event, out)

    def close_block(self, out: list[Event]) -> None:
        """Close the open block, if any."""
        if self.open_kind is not None:
            self.closed(out)
            self.open_kind = None

    def open_block(self, kind: Kind, call: ToolCallDelta | None, out: list[Event]) -> None:
        """Close the open block, if any, and open one of `kind` (an empty answer's empty
        text block, say)."""
        self.close_block(out)
        self.open_kind = kind
        self.open_index = self.blocks
        self.blocks += 1
        self.opened(kind, call, out)

    # -- what an API writes -----------------------------------------------------------

    @abstractmethod
    def opened(self, kind: Kind, call: ToolCallDelta | None, out: list[Event]) -> None:
        """A block of `kind` opened at `open_index` (`call`: a call's first piece)."""

    @abstractmethod
    def grew_reasoning(self, text: str, out: list[Event]) -> None: ...

    @abstractmethod
    def grew_text(self, text: str, event: TokenEvent, out: list[Event]) -> None: ...

    @abstractmethod
    def grew_call(self, arguments: str, out: list[Event]) -> None: ...

    @abstractmethod
    def closed(self, out: list[Event]) -> None:
        """The open block (`open_kind`, `open_index`) closes."""
