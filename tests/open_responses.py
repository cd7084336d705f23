"""The Open Responses compliance suite, ported: openresponses/openresponses'
`src/lib/compliance-tests.ts` (run by its `bin/compliance-test.ts`), its 17 tests as
functions of a `Target` (a base URL, a model, a key), each returning the errors the suite
would report (none: the test passed).

Checked as the suite checks them:

- every response body against the spec's `ResponseResource` (a compaction's against
  `CompactResource`), every streamed event, SSE or WebSocket frame, against the union of
  the spec's streaming events (on a WebSocket, with `WebSocketErrorEvent`), from
  tests/fixtures/open_responses/openapi.json. The suite runs zod schemas generated from
  that file; they are read here as zod reads them: `oneOf` as a union (any branch that
  fits), unknown keys allowed, and `JsonSchemaResponseFormat.schema` as an object or null
  (the JSON file says null only, a slip its generated zod schema does not make);
- then each test's own checks: an output, an output item of a type, `completed`, the
  `previous_response_not_found` of a continuation that cannot be, ...

The ten HTTP tests come first in `TESTS` as the suite lists them, the seven WebSocket
tests (`WEBSOCKET`) among them; `run(target, test_id)` runs one. Used by the suite's port
in the tests (tests/e2e/agents/test_open_responses.py, tests/e2e/test_open_responses_image.py)
and by the peers' benchmark (bench/open_responses.py).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import connect

SPEC = Path(__file__).parent / "fixtures" / "open_responses" / "openapi.json"
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
TIMEOUT_S = 120.0  # one HTTP call
TURN_TIMEOUT_S = 30.0  # one WebSocket turn, as the suite waits

Json = Any


# -- the spec's schemas ---------------------------------------------------------------


def _as_zod(node: Json) -> Json:
    """The spec as the suite's generated zod schemas read it: `oneOf` is a union."""
    if isinstance(node, dict):
        return {("anyOf" if k == "oneOf" else k): _as_zod(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_as_zod(v) for v in node]
    return node


@functools.cache
def _components() -> dict[str, Any]:
    components: dict[str, Any] = _as_zod(json.loads(SPEC.read_text())["components"])
    form = components["schemas"]["JsonSchemaResponseFormat"]["properties"]
    form["schema"] = {"anyOf": [{"type": "object"}, {"type": "null"}]}
    return components


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": _components()}
    return Draft202012Validator(schema)


def _described(error: ValidationError) -> str:
    error = best_match([error])
    where = ".".join(str(p) for p in error.absolute_path) or "(root)"
    return f"{where}: {error.message}"


def schema_errors(name: str, value: Json, prefix: str = "") -> list[str]:
    """What is wrong with `value` as the spec's schema `name` (nothing: it fits)."""
    return [prefix + _described(e) for e in _validator(name).iter_errors(value)]


@functools.cache
def _event_schemas(websocket: bool) -> dict[str, list[str]]:
    """Event type -> the schemas of the streaming-event union that have that type."""
    names = [n for n in _components()["schemas"] if n.endswith("StreamingEvent")]
    if websocket:
        names.append("WebSocketErrorEvent")
    by_type: dict[str, list[str]] = {}
    for name in names:
        for kind in _components()["schemas"][name]["properties"]["type"]["enum"]:
            by_type.setdefault(kind, []).append(name)
    return by_type


def event_errors(event: Json, *, websocket: bool = False) -> list[str]:
    """What is wrong with a streamed event, as the union of the spec's events judges it:
    it fits if one of the schemas of its `type` takes it."""
    kind = event.get("type") if isinstance(event, dict) else None
    candidates = _event_schemas(websocket).get(kind) if isinstance(kind, str) else None
    if not candidates:
        return [f"Event validation failed for {kind}: not a streaming event of the spec"]
    found: list[str] = []
    for name in candidates:
        errors = schema_errors(name, event)
        if not errors:
            return []
        found.extend(errors)
    return [f"Event validation failed for {kind}: {'; '.join(found)}"]


# -- the server under test ------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    base_url: str  # the API's root, ending in /v1
    model: str
    api_key: str = "unused"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http", "ws", 1).rstrip("/") + "/responses"


@dataclass
class Outcome:
    """A test's verdict: the suite's errors (none: passed), and what came back."""

    errors: list[str] = field(default_factory=list)
    bodies: list[Json] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.errors


@dataclass
class Stream:
    """A stream's events (SSE, or one WebSocket turn), what was wrong with them, and its
    terminal response."""

    events: list[Json] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    final: Json = None
    error_event: Json = None
    error_code: str | None = None
    request: Json = None

    def take(self, event: Json, *, websocket: bool) -> bool:
        """Record one event; True once the stream (or turn) has ended."""
        self.events.append(event)
        for error in event_errors(event, websocket=websocket):
            self.errors.append(error)
        if isinstance(event, dict) and event.get("type") in TERMINAL:
            self.final = event.get("response")
            return True
        code = _error_code(event)
        if websocket and isinstance(event, dict) and (event.get("type") == "error" or code):
            self.error_code, self.error_event = code, event
            if code is None:
                self.errors.append(f"WebSocket error event: {json.dumps(event)}")
            return True
        return False


def _error_code(value: Json) -> str | None:
    error = value.get("error") if isinstance(value, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _turn_code(turn: Stream) -> str | None:
    return turn.error_code or _error_code(turn.final)


def _failed(turn: Stream) -> bool:
    final = turn.final if isinstance(turn.final, dict) else {}
    return turn.error_event is not None or bool(_turn_code(turn)) or final.get("status") == "failed"


def _post(target: Target, path: str, body: Json, *, stream: bool = False) -> httpx.Response:
    if stream:
        body = {**body, "stream": True}
    return httpx.post(
        target.base_url.rstrip("/") + path, json=body, headers=target.headers, timeout=TIMEOUT_S
    )


def _sse(response: httpx.Response) -> Stream:
    """A stream's events as the suite's SSE parser reads them (`[DONE]` skipped)."""
    stream = Stream()
    data = ""
    for line in response.text.split("\n"):
        if line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and data:
            if data != "[DONE]":
                try:
                    stream.take(json.loads(data), websocket=False)
                except json.JSONDecodeError:
                    stream.errors.append(f"Failed to parse event data: {data}")
            data = ""
    return stream


def _websocket(
    target: Target,
    steps: list[Json | Callable[[list[Stream]], Json]],
    *,
    check_requests: bool = True,
) -> list[Stream]:
    """One connection, a `response.create` per step (a step may be made from the turns
    before it), each turn read until its terminal event or error."""
    turns: list[Stream] = []
    with connect(target.ws_url, additional_headers=target.headers, open_timeout=30) as ws:
        for step in steps:
            request = step(turns) if callable(step) else step
            if check_requests:
                errors = schema_errors(
                    "WebSocketResponseCreateEvent", request, "WebSocket request "
                )
                if errors:
                    raise AssertionError(f"Request {len(turns) + 1}: {'; '.join(errors)}")
            turn = Stream(request=request)
            turns.append(turn)
            ws.send(json.dumps(request))
            deadline = time.monotonic() + TURN_TIMEOUT_S
            while True:
                try:
                    data = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    turn.errors.append("Timed out waiting for terminal WebSocket response event")
                    return turns
                except ConnectionClosed:
                    if turn.final is None and turn.error_code is None:
                        turn.errors.append("WebSocket closed before a terminal response event")
                    return turns
                text = data if isinstance(data, str) else data.decode()
                if text == "[DONE]":
                    if turn.final is None and turn.error_code is None:
                        turn.errors.append("Received [DONE] before a terminal WebSocket event")
                    break
                try:
                    if turn.take(json.loads(text), websocket=True):
                        break
                except json.JSONDecodeError:
                    turn.errors.append(f"Failed to parse WebSocket event data: {text}")
    return turns


# -- the checks each test makes ---------------------------------------------------------

Check = Callable[[Json, Stream | None], list[str]]


def has_output(response: Json, _: Stream | None) -> list[str]:
    return [] if response.get("output") else ["Response has no output items"]


def has_output_type(kind: str) -> Check:
    def check(response: Json, _: Stream | None) -> list[str]:
        if any(item.get("type") == kind for item in response.get("output") or ()):
            return []
        return [f'Expected output item of type "{kind}" but none found']

    return check


def has_phase(phase: str) -> Check:
    def check(response: Json, _: Stream | None) -> list[str]:
        for item in response.get("output") or ():
            kind, role = item.get("type"), item.get("role")
            if kind == "message" and role == "assistant" and item.get("phase") == phase:
                return []
        return [f'Expected assistant output message with phase "{phase}" but none found']

    return check


def completed(response: Json, _: Stream | None) -> list[str]:
    if "status" not in response:
        return ['Expected a standard response object with a "status" field']
    if response["status"] != "completed":
        return [f'Expected status "completed" but got "{response["status"]}"']
    return []


def compaction_object(response: Json, _: Stream | None) -> list[str]:
    if response.get("object") != "response.compaction":
        return [f'Expected object "response.compaction" but got "{response.get("object")}"']
    return []


def streamed(_: Json, stream: Stream | None) -> list[str]:
    if stream is None:
        return []
    return [] if stream.events else ["No streaming events received"]


def stream_schema(_: Json, stream: Stream | None) -> list[str]:
    return list(stream.errors) if stream is not None else []


STREAMED: tuple[Check, ...] = (streamed, stream_schema, completed)


def judged(
    body: Json,
    checks: tuple[Check, ...],
    stream: Stream | None = None,
    schema: str = "ResponseResource",
) -> list[str]:
    """The schema first (a body that does not fit fails on that), then each check."""
    if not isinstance(body, dict):
        return [*(stream.errors if stream else []), f"(root): expected a {schema}, got {body!r}"]
    errors = schema_errors(schema, body)
    if errors:
        return [*(stream.errors if stream else []), *errors]
    return [error for check in checks for error in check(body, stream)]


# -- the tests ----------------------------------------------------------------------------


def _message(role: str, content: Json, **extra: Json) -> Json:
    return {"type": "message", "role": role, "content": content, **extra}


def _create(target: Target, input: Json, **extra: Json) -> Json:
    return {"type": "response.create", "model": target.model, "input": input, **extra}


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "The city and state, e.g. San Francisco, CA",
            },
        },
        "required": ["location"],
    },
}
# The suite's image: a red heart on white, 32x32, as a data URL (the server fetches nothing).
HEART_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAABmklEQVR42tyWAaTyUBzFew/e"
    "G4AHz+MBSAHKBiJRGFKwIgQQJKLUIioBIhCAiCAAEizAQIAECaASqFFJq84nudjnaqvuPnxzgP9xfrq5938csPn7PwHT"
    "KSoViCIEAYEAMhmoKsU2mUCWEQqB5xEMIp/HaGQG2G6RSuH9HQ7H34rFrtPbdz4jl6PbwmEsl3QA1mt4vcRKk8dz9eg6"
    "IpF7tt9fzGY0gCgafFRFo5Blc5vLhf3eCOj1yNhM5GRMVK0aATxPZoz09YXjkQDmczJgquGQAPp9WwCNBgG027YACgUC"
    "6HRsAZRKBDAY2AJoNv/ZnwzA6WScznG3p4UAymXGAEkyXrTFAh8fLAGqagQAyGaZpYsi7bHTNPz8MEj//LxuFPo+UBS8"
    "vb0KaLXubrRa7aX0RMLCykwmn0z3+XA4WACcTpCkh9MFAZpmuVXo+mO/w+/HZvNgbblcUCxaSo/Hyck80Yu6XXDcvfVZ"
    "r79cvMZjuN2U9O9vKAqjZrfbIZ0mV4TUi9Xqz6jddNy//7+e3n8Fhf/Llo2kxi8AQyGRoDkmAhAAAAAASUVORK5CYII="
)
# The suite's schema fixture: a response whose assistant messages carry phase labels.
PHASE_FIXTURE = {
    "id": "resp_phase_schema",
    "object": "response",
    "created_at": 1764967971,
    "completed_at": 1764967972,
    "status": "completed",
    "incomplete_details": None,
    "previous_response_id": None,
    "instructions": None,
    "output": [
        {
            "id": f"msg_phase_{name}",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "phase": phase,
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        for name, phase, text in (
            ("commentary", "commentary", "I am checking the answer."),
            ("final", "final_answer", "The answer is four."),
        )
    ],
    "error": None,
    "tools": [],
    "tool_choice": "auto",
    "truncation": "disabled",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
    "top_p": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "top_logprobs": 0,
    "temperature": 1,
    "reasoning": {"effort": None, "summary": None},
    "usage": {
        "input_tokens": 1,
        "output_tokens": 2,
        "total_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    },
    "max_output_tokens": None,
    "max_tool_calls": None,
    "store": True,
    "background": False,
    "service_tier": "default",
    "metadata": {},
    "safety_identifier": None,
    "prompt_cache_key": None,
}


def single(
    target: Target,
    body: Json,
    checks: tuple[Check, ...],
    *,
    stream: bool = False,
    path: str = "/responses",
    schema: str = "ResponseResource",
) -> Outcome:
    """One request, as the suite's single-request tests make it."""
    response = _post(target, path, body, stream=stream)
    if response.status_code != 200:
        return Outcome([f"HTTP {response.status_code}: {response.text}"], [response.text])
    if stream:
        events = _sse(response)
        return Outcome(judged(events.final, checks, events), [events.final])
    data = response.json()
    return Outcome(judged(data, checks, schema=schema), [data])


def basic_response(target: Target) -> Outcome:
    body = {"model": target.model, "input": [_message("user", "Say hello in exactly 3 words.")]}
    return single(target, body, (has_output, completed))


def assistant_phase(target: Target) -> Outcome:
    body = {
        "model": target.model,
        "input": [
            _message("assistant", "I should answer with the saved number.", phase="commentary"),
            _message("assistant", "The number is four.", phase="final_answer"),
            _message("user", "Repeat only the number."),
        ],
    }
    return single(target, body, (has_output, completed))


def output_phase_schema(target: Target) -> Outcome:
    fixture = {**PHASE_FIXTURE, "model": target.model}
    checks = (has_output, completed, has_phase("commentary"), has_phase("final_answer"))
    return Outcome(judged(fixture, checks), [fixture])


def streaming_response(target: Target) -> Outcome:
    body = {"model": target.model, "input": [_message("user", "Count from 1 to 5.")]}
    return single(target, body, STREAMED, stream=True)


def system_prompt(target: Target) -> Outcome:
    body = {
        "model": target.model,
        "input": [
            _message("system", "You are a pirate. Always respond in pirate speak."),
            _message("user", "Say hello."),
        ],
    }
    return single(target, body, (has_output, completed))


def tool_calling(target: Target) -> Outcome:
    body = {
        "model": target.model,
        "input": [_message("user", "What's the weather like in San Francisco?")],
        "tools": [WEATHER_TOOL],
    }
    return single(target, body, (has_output, has_output_type("function_call")))


def image_input(target: Target) -> Outcome:
    content = [
        {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
        {"type": "input_image", "image_url": HEART_PNG},
    ]
    body = {"model": target.model, "input": [_message("user", content)]}
    return single(target, body, (has_output, completed))


def multi_turn(target: Target) -> Outcome:
    body = {
        "model": target.model,
        "input": [
            _message("user", "My name is Alice."),
            _message("assistant", "Hello Alice! Nice to meet you. How can I help you today?"),
            _message("user", "What is my name?"),
        ],
    }
    return single(target, body, (has_output, completed))


def compact_response(target: Target) -> Outcome:
    body = {
        "model": target.model,
        "prompt_cache_key": "openresponses-compact-test",
        "input": [
            _message("user", "We agreed to launch on Tuesday and notify support first."),
            _message(
                "assistant", "Understood. The launch is Tuesday, with support notified beforehand."
            ),
        ],
    }
    checks = (has_output, compaction_object, has_output_type("compaction"))
    return single(target, body, checks, path="/responses/compact", schema="CompactResource")


def compact_missing_model(target: Target) -> Outcome:
    body = {"input": [_message("user", "Compact this conversation.")]}
    response = _post(target, "/responses/compact", body)
    if response.status_code not in (400, 422):
        return Outcome([f"HTTP {response.status_code}: {response.text}"], [response.text])
    return Outcome([], [response.text])


def _turn_errors(turn: Stream, index: int) -> list[str]:
    return [f"Turn {index + 1}: {e}" for e in judged(turn.final, STREAMED, turn)]


def _has_id(turn: Stream) -> list[str]:
    if not isinstance(turn.final, dict):
        return [*turn.errors, "Warmup response did not include an id"]
    errors = schema_errors("ResponseResource", turn.final)
    return [*turn.errors, *errors] if errors else list(turn.errors)


def _first_id(turns: list[Stream]) -> str:
    final = turns[0].final if turns else None
    if not isinstance(final, dict) or not final.get("id"):
        raise AssertionError("First WebSocket turn did not return a response id")
    return str(final["id"])


def websocket_response(target: Target) -> Outcome:
    request = _create(target, [_message("user", "Count from 1 to 3.")])
    (turn,) = _websocket(target, [request])
    return Outcome(judged(turn.final, STREAMED, turn), [turn.final])


def websocket_sequential(target: Target) -> Outcome:
    requests = [
        _create(target, "Reply with exactly: first", store=False),
        _create(target, "Reply with exactly: second", store=False),
    ]
    turns = _websocket(target, list(requests))
    errors = [e for i, turn in enumerate(turns) for e in _turn_errors(turn, i)]
    if len(turns) < len(requests):
        errors.append(f"only {len(turns)} of {len(requests)} turns ran")
    return Outcome(errors, [turn.final for turn in turns])


def websocket_continuation(target: Target) -> Outcome:
    first = _create(target, "Remember the code word: cobalt. Reply with OK.", store=False)

    def second(turns: list[Stream]) -> Json:
        return _create(
            target,
            "What is the code word? Reply with only the code word.",
            store=False,
            previous_response_id=_first_id(turns),
        )

    turns = _websocket(target, [first, second])
    errors = _has_id(turns[0])
    if errors or len(turns) < 2:
        return Outcome(
            errors or ["Second WebSocket continuation turn did not run"], [turns[0].final]
        )
    return Outcome(judged(turns[1].final, STREAMED, turns[1]), [t.final for t in turns])


def websocket_reconnect_recovery(target: Target) -> Outcome:
    first = _create(target, "Remember the code word: copper. Reply with OK.", store=False)
    (turn,) = _websocket(target, [first])
    errors = _has_id(turn)
    if errors:
        return Outcome(errors, [turn.final])
    reconnect = _create(
        target,
        "Try to continue after reconnect. Reply with exactly: reconnected",
        store=False,
        previous_response_id=turn.final["id"],
    )
    recovery = _create(
        target,
        [
            _message(
                "user",
                "The previous store:false chain could not continue after reconnect. Start a new "
                "response and reply with exactly: recovered",
            )
        ],
        store=False,
    )
    turns = _websocket(target, [reconnect, recovery])
    errors = list(turns[0].errors)
    code = _turn_code(turns[0])
    if code != "previous_response_not_found":
        errors.append(
            "Expected previous_response_not_found after reconnecting a store:false chain but "
            f"got {code or 'no error code'}"
        )
    if len(turns) < 2:
        errors.append("Recovery WebSocket turn did not run after reconnect miss")
    else:
        errors.extend(judged(turns[1].final, (), turns[1]))
    return Outcome(errors, [turn.final, turns[0].error_event, turns[-1].final])


def websocket_missing_previous(target: Target) -> Outcome:
    request = _create(
        target,
        "This should fail because the previous response is missing.",
        store=False,
        previous_response_id=f"resp_openresponses_missing_{int(time.time() * 1000)}",
    )
    (turn,) = _websocket(target, [request])
    errors = list(turn.errors)
    code = _turn_code(turn)
    if code != "previous_response_not_found":
        errors.insert(0, f"Expected previous_response_not_found but got {code or 'no error code'}")
    return Outcome(errors, [turn.error_event or turn.final])


def websocket_failed_continuation_evicts(target: Target) -> Outcome:
    first = _create(target, "Remember the code word: ember. Reply with OK.", store=False)
    output = {
        "type": "function_call_output",
        "call_id": "call_openresponses_missing",
        "output": "No matching tool call exists in the previous response.",
    }

    def failing(turns: list[Stream]) -> Json:
        return _create(target, [output], store=False, previous_response_id=_first_id(turns))

    def retry(turns: list[Stream]) -> Json:
        return _create(
            target,
            "Try to continue after the failed turn. Reply with exactly: stale",
            store=False,
            previous_response_id=_first_id(turns),
        )

    turns = _websocket(target, [first, failing, retry])
    errors = _has_id(turns[0])
    if len(turns) < 2:
        errors.append("Failed WebSocket continuation turn did not run")
    elif not _failed(turns[1]):
        status = turns[1].final.get("status") if isinstance(turns[1].final, dict) else None
        errors.extend(turns[1].errors)
        errors.append(
            "Expected second WebSocket continuation turn to fail but got status "
            f"{status or 'no terminal response'}"
        )
    if len(turns) < 3:
        errors.append("Retry WebSocket continuation turn did not run")
    else:
        errors.extend(turns[2].errors)
        code = _turn_code(turns[2])
        if code != "previous_response_not_found":
            errors.append(
                "Expected previous_response_not_found after failed continuation eviction but "
                f"got {code or 'no error code'}"
            )
    return Outcome(errors, [t.error_event or t.final for t in turns])


def websocket_compact_new_chain(target: Target) -> Outcome:
    compact = {
        "model": target.model,
        "input": [
            _message(
                "user",
                [{"type": "input_text", "text": "Remember the compaction code word: slate."}],
            ),
            _message("assistant", [{"type": "output_text", "text": "OK."}]),
            _message(
                "user",
                [
                    {
                        "type": "input_text",
                        "text": "Compress this conversation for later continuation.",
                    }
                ],
            ),
        ],
    }
    response = _post(target, "/responses/compact", compact)
    if response.status_code != 200:
        return Outcome(
            [f"HTTP {response.status_code} from /responses/compact: {response.text}"],
            [response.text],
        )
    output = response.json().get("output") if isinstance(response.json(), dict) else None
    if not isinstance(output, list):
        return Outcome(["Compaction response did not include an output array"], [response.json()])
    request = _create(
        target,
        [*output, _message("user", "Continue from here. Reply with exactly: compacted")],
        store=False,
        tools=[],
    )
    # The compacted items are the server's own, given back as they are: the suite does not
    # hold them to a request schema.
    (turn,) = _websocket(target, [request], check_requests=False)
    return Outcome(judged(turn.final, STREAMED, turn), [response.json(), turn.final])


TESTS: dict[str, Callable[[Target], Outcome]] = {
    "basic-response": basic_response,
    "assistant-phase": assistant_phase,
    "response-output-phase-schema": output_phase_schema,
    "streaming-response": streaming_response,
    "websocket-response": websocket_response,
    "websocket-sequential-responses": websocket_sequential,
    "websocket-continuation": websocket_continuation,
    "websocket-reconnect-store-false-recovery": websocket_reconnect_recovery,
    "websocket-previous-response-not-found": websocket_missing_previous,
    "websocket-failed-continuation-evicts-cache": websocket_failed_continuation_evicts,
    "websocket-compact-new-chain": websocket_compact_new_chain,
    "system-prompt": system_prompt,
    "tool-calling": tool_calling,
    "image-input": image_input,
    "multi-turn": multi_turn,
    "compact-response": compact_response,
    "compact-missing-model": compact_missing_model,
}
WEBSOCKET = tuple(name for name in TESTS if name.startswith("websocket-"))


def run(target: Target, test_id: str) -> Outcome:
    """One of the suite's tests against `target`; a failure to talk to it is the test's
    error, as the suite reports it."""
    try:
        return TESTS[test_id](target)
    except (httpx.HTTPError, OSError, AssertionError, WebSocketException, ValueError) as exc:
        return Outcome([f"{type(exc).__name__}: {exc}"])


def run_all(target: Target, ids: Iterator[str] | None = None) -> dict[str, Outcome]:
    return {test_id: run(target, test_id) for test_id in (ids or iter(TESTS))}
