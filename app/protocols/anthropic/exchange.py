"""POST /v1/messages as an `app.protocols.exchange.Exchange`: the body planned by the
conversation core, its one engine request's events encoded as Anthropic's message and
stream.

A stream, as the anthropic SDK's accumulator and Claude Code read it:

    message_start        (id, model, empty content, usage: the prompt's tokens split
                          into input_tokens and cache_read_input_tokens)
    ping
    per content block:   content_block_start (text "", tool_use with input {}, or
                          thinking ""), content_block_delta* (text_delta,
                          input_json_delta, thinking_delta), content_block_stop
    message_delta        (stop_reason, stop_sequence; usage, cumulative)
    message_stop

Blocks open and close as the output's kind changes (`app.protocols.conversation.blocks`,
as the Responses API's items do): text, each tool call (its id and name open it; its
argument fragments are its `input_json_delta`s, which join into its input), and thinking
(a reasoning parser's). `message_start` waits for the engine's first
event, which says how much of the prompt the prefix cache held; a failure after the
first byte is an `error` event, which ends the stream. An answer with no content has one
empty text block, streamed or not, so `content[0]` always exists.

Not streamed, the same content in the same order: thinking, text, tool calls (`input`
the call's arguments parsed; a call whose arguments are not JSON, which only a model
left free can write, gets `{}`).

`stop_reason`: the neutral finish "length" is `max_tokens`, "tool_calls" is `tool_use`
(forced calls included), a matched stop string is `stop_sequence` with the string in
`stop_sequence`, anything else `end_turn`.

`usage`: Anthropic counts a prompt as `input_tokens + cache_read_input_tokens +
cache_creation_input_tokens`; the prefix cache's hits are the cache reads, the rest is
input, and nothing is a cache creation (vLLM caches every prompt by itself, at no
charge). So count_tokens equals the sum, and equals `input_tokens` when nothing was
cached.

The per-token path builds two small dicts per text delta and nothing else (no models).
"""

from __future__ import annotations

from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from app.engine.models import ServedModel
from app.engine.tools import ToolCallDelta
from app.errors import SwitchboardError
from app.protocols.accounting import Accounting
from app.protocols.anthropic.errors import error_body
from app.protocols.anthropic.messages import conversation
from app.protocols.conversation.blocks import Kind, OutputBlocks
from app.protocols.conversation.output import ChoiceOutput
from app.protocols.conversation.plan import plan_conversation
from app.protocols.exchange import Event
from app.wire_text import load_json
from schemas.anthropic import AnthropicMessagesRequest

_PING: Event = ("ping", {"type": "ping"})
_STOP: Event = ("message_stop", {"type": "message_stop"})


def _input(arguments: str) -> Any:
    try:
        return load_json(arguments or "{}")
    except ValueError:
        return {}


class MessagesExchange(OutputBlocks):
    ends_with_done = False

    def __init__(
        self,
        body: AnthropicMessagesRequest,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        message_id: str,
        served: ServedModel,
    ) -> None:
        """Plans the call (blocking: build it off the event loop)."""
        super().__init__()
        call = conversation(body, info, request_id=message_id, lora_name=served.lora_name)
        plan = plan_conversation(call, info, tokenizer)
        self.requests: tuple[GenerationRequest, ...] = plan.requests
        self._id = message_id
        self._model = served.name
        self._output = ChoiceOutput(plan.new_parser() if plan.new_parser is not None else None)
        self.accounting = Accounting([0])

    # -- what both modes share --------------------------------------------------------

    def _usage(self) -> dict[str, int]:
        usage = self.accounting.usage()
        return {
            "input_tokens": usage.prompt_tokens - usage.cached_tokens,
            "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens,
            "cache_creation_input_tokens": 0,
        }

    def _stop(self) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence), once the request has ended."""
        state = self.accounting.states[0]
        finish = self._output.finish(state.finish_reason)
        if finish == "length":
            return "max_tokens", None
        if finish == "tool_calls":
            return "tool_use", None
        if isinstance(state.stop_reason, str):
            return "stop_sequence", state.stop_reason
        return "end_turn", None

    def _message(
        self, content: list[dict[str, Any]], stop: tuple[str | None, str | None]
    ) -> dict[str, Any]:
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": self._usage(),
        }

    # -- streamed -----------------------------------------------------------------------

    def opening(self) -> list[Event]:
        return []

    # -- the streamed content's blocks (`OutputBlocks`) --------------------------------

    def opened(self, kind: Kind, call: ToolCallDelta | None, out: list[Event]) -> None:
        block: dict[str, Any]
        if call is not None:
            block = {"type": "tool_use", "id": call.id or "", "name": call.name or "", "input": {}}
        elif kind == "text":
            block = {"type": "text", "text": ""}
        else:
            block = {"type": "thinking", "thinking": "", "signature": ""}
        start = {"type": "content_block_start", "index": self.open_index, "content_block": block}
        out.append(("content_block_start", start))

    def _delta(self, out: list[Event], delta: dict[str, Any]) -> None:
        body = {"type": "content_block_delta", "index": self.open_index, "delta": delta}
        out.append(("content_block_delta", body))

    def grew_reasoning(self, text: str, out: list[Event]) -> None:
        self._delta(out, {"type": "thinking_delta", "thinking": text})

    def grew_text(self, text: str, event: TokenEvent, out: list[Event]) -> None:
        self._delta(out, {"type": "text_delta", "text": text})

    def grew_call(self, arguments: str, out: list[Event]) -> None:
        self._delta(out, {"type": "input_json_delta", "partial_json": arguments})

    def closed(self, out: list[Event]) -> None:
        stop = {"type": "content_block_stop", "index": self.open_index}
        out.append(("content_block_stop", stop))

    def events(self, index: int, event: TokenEvent) -> list[Event]:
        state = self.accounting.account(index, event)
        out: list[Event] = []
        if not state.started:
            state.started = True
            out.append(
                (
                    "message_start",
                    {"type": "message_start", "message": self._message([], (None, None))},
                )
            )
            out.append(_PING)
        self.write_output(self._output, event, out)
        return out

    def closing(self) -> list[Event]:
        out: list[Event] = []
        if self.blocks == 0:
            self.open_block("text", None, out)
        self.close_block(out)
        stop_reason, stop_sequence = self._stop()
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out.append(
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": self._usage()})
        )
        out.append(_STOP)
        return out

    def failure(self, error: SwitchboardError) -> list[Event]:
        return [("error", error_body(error))]

    # -- not streamed -----------------------------------------------------------------

    def feed(self, index: int, event: TokenEvent) -> None:
        self.accounting.account(index, event)
        self._output.add(event)

    def result(self) -> dict[str, Any]:
        parsed = self._output.result()
        content: list[dict[str, Any]] = []
        if parsed.reasoning:
            content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
        if parsed.content:
            content.append({"type": "text", "text": parsed.content})
        for call in parsed.tool_calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": _input(call.arguments),
                }
            )
        if not content:
            content.append({"type": "text", "text": ""})
        return self._message(content, self._stop())
