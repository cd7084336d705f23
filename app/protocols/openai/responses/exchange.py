"""`ResponsesExchange`: one Responses API call as an `app.protocols.exchange.Exchange`:
its plan (one engine request), and the engine's events encoded as the Responses API's
output items, a response object and, streamed, its events.

Streamed, the output is read as it comes (`ChoiceOutput.delta`) and cut into items as
Messages cuts it into blocks (`app.protocols.conversation.blocks`): visible text opens a
`message` item, a tool call's first piece closes whatever is open and opens a
`function_call` item, reasoning (from a reasoning parser) a `reasoning` item; each item
is announced (`response.output_item.added`, `response.content_part.added`), grows by
deltas (`response.output_text.delta`, `response.function_call_arguments.delta`,
`response.reasoning_text.delta`) and is closed (`.done`, `response.content_part.done`,
`response.output_item.done`) before the next one opens. The stream opens with
`response.created` and `response.in_progress` and ends with `response.completed` (or
`response.incomplete` when `max_output_tokens` cut it: the items are then `incomplete`),
or, when something fails after the first byte, with `error` and `response.failed`.
Not streamed, the whole output is parsed once (`ChoiceOutput.result`) into the same
items in the same order (reasoning, message, calls).

Invariants: every event has the next `sequence_number`; an item's id is the same in every
event that names it and in the final response (the SDK's stream accumulator checks it);
the final response of a stream holds exactly the items streamed, with the text and
arguments the deltas add up to; an output is never empty (no text and no call is one
empty message, as a non-streamed answer would have it).

The per-token path builds one dict per delta and nothing else: no model, no copy of what
came before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from app.engine.models import ServedModel
from app.engine.tools import ToolCallDelta
from app.errors import ContextLengthExceeded, SwitchboardError
from app.protocols.accounting import Accounting
from app.protocols.conversation.blocks import Kind, OutputBlocks
from app.protocols.conversation.output import ChoiceOutput
from app.protocols.conversation.plan import ChatPlan, plan_conversation
from app.protocols.exchange import Event
from app.protocols.openai.conversations import conversation_id
from app.protocols.openai.logprobs import chat_logprobs
from app.protocols.openai.responses.events import (
    Body,
    Events,
    item_shell,
    part_shell,
    replay_item,
    response_error,
)
from app.protocols.openai.responses.items import Item, new_id
from app.protocols.openai.responses.request import Translated, translate
from app.protocols.openai.responses.tools import echoed_choice, echoed_tools
from schemas.openai_responses import ResponsesRequest

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


@dataclass(slots=True)
class _Open:
    """The item being streamed: its place in `output`, and what it has so far."""

    kind: Kind
    index: int
    item: Body
    pieces: list[str] = field(default_factory=list)
    logprobs: list[Body] = field(default_factory=list)


def plan_with_truncation(
    translated: Translated, info: EngineInfo, tokenizer: Tokenizer
) -> ChatPlan:
    """The plan; with `truncation: "auto"`, the fewest oldest turns dropped (at a user
    message, so no call loses its answer or an answer its call) that make it fit."""
    try:
        return plan_conversation(translated.conversation, info, tokenizer)
    except ContextLengthExceeded as exc:
        if not translated.truncate:
            raise
        too_long = exc
    call = translated.conversation
    head = list(call.messages[: translated.first_droppable])
    rest = list(call.messages[translated.first_droppable :])
    cuts = [i for i in range(1, len(rest)) if rest[i].role == "user"]
    best: ChatPlan | None = None
    lo, hi = 0, len(cuts) - 1
    while lo <= hi:  # the earliest cut that fits: fitting is monotone in the cut
        mid = (lo + hi) // 2
        shorter = replace(call, messages=[*head, *rest[cuts[mid] :]])
        try:
            best = plan_conversation(shorter, info, tokenizer)
            hi = mid - 1
        except ContextLengthExceeded:
            lo = mid + 1
    if best is None:
        raise too_long
    return best


def echoed_format(body: ResponsesRequest) -> Body:
    """`text.format` as a response object echoes it: a `json_schema` format with every
    field the spec's `JsonSchemaResponseFormat` has (`description` null when not given,
    `strict` false, OpenAI's default)."""
    form = body.text.format if body.text is not None and body.text.format else None
    if form is None or form.type == "text":
        return {"type": "text"}
    if form.type == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "name": form.name or "",
        "description": form.description,
        "schema": form.schema_,
        "strict": bool(form.strict),
    }


class ResponsesExchange(OutputBlocks):
    ends_with_done = False

    def __init__(
        self,
        body: ResponsesRequest,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        response_id: str,
        created_at: int,
        served: ServedModel,
        context: Sequence[Item] = (),
        input_items: Sequence[Item] = (),
        generate: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Plans the call (blocking: build it off the event loop). `context` is the stored
        conversation `previous_response_id` continues; `input_items` the body's input in
        normal form (`items.read_input`); `served` the model the body named; `clock` says
        when it completed. A response in a `conversation` has its items as `context`. Not
        to `generate` (a websocket's warm-up, `generate: false`): planned, with every
        check, and not run (no engine request); it completes with no output, to continue
        from."""
        super().__init__()
        translated = translate(
            body, context, input_items, info, request_id=response_id, lora_name=served.lora_name
        )
        plan = plan_with_truncation(translated, info, tokenizer)
        self.id = response_id
        self.context = tuple(context)
        self.input_items = tuple(input_items)
        self.plan = plan
        self._requests = plan.requests if generate else ()
        self._tokenizer = tokenizer
        self._namespaces = translated.namespaces
        self._output = ChoiceOutput(plan.new_parser() if plan.new_parser is not None else None)
        self.accounting = Accounting([0])
        self._want_logprobs = plan.requests[0].sampling.logprobs is not None
        self._events = Events()
        self._items: list[Body] = []
        self._open: _Open | None = None
        self._closing_as = "completed"  # the status the open item closes with
        self._opened = False  # response.created is out
        self.ended: Body | None = None  # the response as it ended, once it has
        self._logprobs: list[Body] = []  # not streamed: every token's
        call = translated.conversation
        self._clock = clock
        self._completed_at: int | None = None
        self._base: Body = {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "model": served.name,
            "instructions": body.instructions,
            "metadata": body.metadata or {},
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": call.sampling.temperature,
            "top_p": call.sampling.top_p,
            "presence_penalty": call.sampling.presence_penalty,
            "frequency_penalty": call.sampling.frequency_penalty,
            "top_logprobs": body.top_logprobs or 0,
            "tool_choice": echoed_choice(call.tool_choice),
            "tools": echoed_tools(call.tools),
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "previous_response_id": body.previous_response_id,
            "store": body.store,
            "background": body.background,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "text": {"format": echoed_format(body)},
            "truncation": body.truncation or "disabled",
            "user": body.user,
            "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key,
        }
        self.conversation = (
            None if body.conversation is None else conversation_id(body.conversation)
        )
        if self.conversation is not None:
            self._base["conversation"] = {"id": self.conversation}

    # -- what the transport reads ----------------------------------------------------

    @property
    def requests(self) -> Sequence[GenerationRequest]:
        return self._requests

    def response(
        self, status: str, *, error: SwitchboardError | None = None, with_usage: bool = True
    ) -> Body:
        """The response object now: `status`, the items so far (closed ones as they
        closed), usage once the engine has said anything."""
        usage = None
        if with_usage:
            counted = self.accounting.usage()
            usage = {
                "input_tokens": counted.prompt_tokens,
                "input_tokens_details": {"cached_tokens": counted.cached_tokens},
                "output_tokens": counted.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counted.total_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        if status == "completed" and self._completed_at is None:
            self._completed_at = int(self._clock())
        return {
            **self._base,
            "status": status,
            "completed_at": self._completed_at if status == "completed" else None,
            "output": [dict(item) for item in self._items],
            "error": response_error(error) if error is not None else None,
            "incomplete_details": incomplete,
            "usage": usage,
        }

    def status(self) -> str:
        """completed, incomplete (cut by max_output_tokens) or cancelled (aborted), once
        the request has ended."""
        finish = self._output.finish(self.accounting.states[0].finish_reason)
        if finish == "length":
            return "incomplete"
        if finish == "abort":
            return "cancelled"
        return "completed"

    # -- streamed --------------------------------------------------------------------

    def queued(self) -> list[Event]:
        """A background run's opening, before it runs: `response.created`, queued (its
        `in_progress()` follows when the engine starts it)."""
        self._opened = True
        queued = self.response("queued", with_usage=False)
        return [self._events.lifecycle("response.created", queued)]

    def opening(self) -> list[Event]:
        """`response.created` and `response.in_progress` (nothing once `queued()`)."""
        if self._opened:
            return []
        self._opened = True
        created = self.response("in_progress", with_usage=False)
        return [self._events.lifecycle("response.created", created), self.in_progress()]

    def in_progress(self) -> Event:
        return self._events.lifecycle(
            "response.in_progress", self.response("in_progress", with_usage=False)
        )

    def events(self, index: int, event: TokenEvent) -> list[Event]:
        self.accounting.account(index, event)
        out: list[Event] = []
        self.write_output(self._output, event, out)
        return out

    def settle(self) -> list[Event]:
        """The events that close the output (before the terminal event)."""
        status = self.status()
        out: list[Event] = []
        self._closing_as = "incomplete" if status == "incomplete" else "completed"
        self.close_block(out)
        if not self._items:
            empty = self._message_item(new_id("msg"), "", [], status)
            self._items.append(empty)
            out.extend(replay_item(self._events, 0, empty))
        return out

    def terminal(self) -> tuple[Event, Body]:
        """The last event and the response it carries."""
        status = self.status()
        response = self.response(status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        self.ended = response
        return self._events.lifecycle(kind, response), response

    def closing(self) -> list[Event]:
        if not self._requests:  # planned, not generated: completed with no output
            self.ended = self.response("completed")
            return [self._events.lifecycle("response.completed", self.ended)]
        return [*self.settle(), self.terminal()[0]]

    def failure(self, error: SwitchboardError) -> list[Event]:
        self.fail()
        return [
            self._events.error(error),
            self._events.lifecycle("response.failed", self.response("failed", error=error)),
        ]

    def cancelled(self) -> list[Event]:
        """The end of a run its client cancelled: what is open closed as incomplete, and
        `response.incomplete` with the response `cancelled` (as a stored one replays)."""
        self.fail()
        self.ended = self.response("cancelled")
        return [self._events.lifecycle("response.incomplete", self.ended)]

    def fail(self) -> None:
        """Close what is open as incomplete, without events (the run failed)."""
        if self._open is not None:
            self._finish_open("incomplete")
            self.open_kind = None

    # -- not streamed ----------------------------------------------------------------

    def feed(self, index: int, event: TokenEvent) -> None:
        self.accounting.account(index, event)
        self._output.add(event)
        if self._want_logprobs and event.logprobs:
            self._logprobs.extend(
                chat_logprobs(event.token_ids, event.logprobs, self._tokenizer.token_to_str)
            )

    def result(self) -> dict[str, Any]:
        parsed = self._output.result()
        status = self.status()
        item_status = "incomplete" if status == "incomplete" else "completed"
        if parsed.reasoning:
            self._items.append(self._reasoning_item(new_id("rs"), parsed.reasoning, item_status))
        if parsed.content or not parsed.tool_calls:
            self._items.append(
                self._message_item(new_id("msg"), parsed.content or "", self._logprobs, item_status)
            )
        for call in parsed.tool_calls:
            self._items.append(self._call_item(call.id, call.name, call.arguments, item_status))
        self.ended = self.response(status)
        return self.ended

    # -- items -----------------------------------------------------------------------

    @staticmethod
    def _message_item(item_id: str, text: str, logprobs: list[Body], status: str) -> Body:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
        return {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [part],
        }

    @staticmethod
    def _reasoning_item(item_id: str, text: str, status: str) -> Body:
        return {
            "id": item_id,
            "type": "reasoning",
            "status": status,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }

    def _call_item(self, call_id: str, name: str, arguments: str, status: str) -> Body:
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        }
        namespace = self._namespaces.get(name)
        if namespace is not None:
            item["namespace"] = namespace
        return item

    # -- the streamed output's items (`OutputBlocks`) ----------------------------------

    def opened(self, kind: Kind, call: ToolCallDelta | None, out: list[Event]) -> None:
        if call is not None:
            item = self._call_item(call.id or new_id("call"), call.name or "", "", "in_progress")
        elif kind == "text":
            item = self._message_item(new_id("msg"), "", [], "in_progress")
        else:
            item = self._reasoning_item(new_id("rs"), "", "in_progress")
        index = self.open_index
        self._items.append(item)
        self._open = _Open(kind, index, item)
        out.append(self._events.item_added(index, item_shell(item)))
        if call is None:
            part = item["content"][0]
            out.append(self._events.part(False, item["id"], index, 0, part_shell(part)))

    def grew_reasoning(self, text: str, out: list[Event]) -> None:
        opened = self._open
        assert opened is not None
        opened.pieces.append(text)
        out.append(self._events.reasoning_delta(opened.item["id"], opened.index, text))

    def grew_text(self, text: str, event: TokenEvent, out: list[Event]) -> None:
        opened = self._open
        assert opened is not None
        opened.pieces.append(text)
        logprobs = None
        if self._want_logprobs and event.logprobs:
            logprobs = chat_logprobs(event.token_ids, event.logprobs, self._tokenizer.token_to_str)
            opened.logprobs.extend(logprobs)
        out.append(self._events.text_delta(opened.item["id"], opened.index, text, logprobs))

    def grew_call(self, arguments: str, out: list[Event]) -> None:
        opened = self._open
        assert opened is not None
        opened.pieces.append(arguments)
        out.append(self._events.arguments_delta(opened.item["id"], opened.index, arguments))

    def closed(self, out: list[Event]) -> None:
        """The open item closes (as `_closing_as`), with its done events."""
        opened = self._finish_open(self._closing_as)
        item, index = opened.item, opened.index
        item_id = item["id"]
        if opened.kind == "call":
            out.append(self._events.arguments_done(item_id, index, item["name"], item["arguments"]))
        else:
            part = item["content"][0]
            if opened.kind == "text":
                out.append(self._events.text_done(item_id, index, part["text"], part["logprobs"]))
            else:
                out.append(self._events.reasoning_done(item_id, index, part["text"]))
            out.append(self._events.part(True, item_id, index, 0, part))
        out.append(self._events.item_done(index, item))

    def _finish_open(self, status: str) -> _Open:
        opened = self._open
        assert opened is not None
        self._open = None
        text = "".join(opened.pieces)
        if opened.kind == "text":
            final = self._message_item(opened.item["id"], text, opened.logprobs, status)
        elif opened.kind == "reasoning":
            final = self._reasoning_item(opened.item["id"], text, status)
        else:
            final = {**opened.item, "status": status, "arguments": text}
        self._items[opened.index] = final
        opened.item = final
        return opened
