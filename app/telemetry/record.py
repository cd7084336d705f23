"""`RequestRecord`: what an operator sees of one request, filled as it is served and
reported once it ends (`app.telemetry.reports.Telemetry.close`: its span, its access-log
line, its metrics).

The transport's edge opens it (an HTTP request, a websocket's call, a gRPC call) with the
request id and the caller's trace context; the road fills the rest where it happens:
admission (`admitted`, and the engine's first event: `first_token`), the prompt built
(`built`), the engine requests it ran (`for_engine`: their ids prefixed with the request
id; traced, the W3C context of this request's span and the engine's stage times), the
tokens and finishes counted (`count`), a failure (`failed`), the client gone
(`cancelled`). Times are `time.monotonic()` seconds, the clock the engine's stage times
use too.

Untraced (`span` None), a record is a few fields set once each: no work per token, and
nothing else allocated per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from app.engine.base import EngineTrace, GenerationRequest, TokenEvent
from app.errors import Overloaded, SwitchboardError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from app.protocols.accounting import Accounting


def counted(
    record: RequestRecord, receive: Callable[[int, TokenEvent], None]
) -> Callable[[int, TokenEvent], None]:
    """`receive`, each event counted on `record` first (a call whose exchange counts none)."""

    def count(index: int, event: TokenEvent) -> None:
        record.count_event(event)
        receive(index, event)

    return count


# The APIs whose calls are counted per API (the `api` label: a closed set, so the
# metrics' cardinality stays bounded) and the GenAI operation each performs.
OPERATIONS = {
    "completions": "text_completion",
    "chat": "chat",
    "responses": "chat",
    "messages": "chat",
    "graphpipe": "text_completion",
    "evergreen": "text_completion",
    "salience": "text_completion",
    "tokens": "text_completion",  # llm-d's token-in/token-out
    "smg": "text_completion",  # SMG's gRPC workers
}

# Outcomes (the `outcome` label of the request counter).
OK, CLIENT_ERROR, REFUSED, FAILED, CANCELLED = (
    "ok",
    "client_error",
    "refused",
    "failed",
    "cancelled",
)
OUTCOMES = (OK, CLIENT_ERROR, REFUSED, FAILED, CANCELLED)


class RequestRecord:
    __slots__ = (
        "admitted",
        "api",
        "built",
        "cached_tokens",
        "cancelled",
        "client",
        "ended",
        "engine_headers",
        "error",
        "finish_reasons",
        "first_request",
        "first_token",
        "handed_off",
        "input_tokens",
        "last_token",
        "method",
        "model",
        "name",
        "output_tokens",
        "request_id",
        "route",
        "span",
        "started",
        "status",
        "tenant",
        "traces",
    )

    def __init__(
        self,
        request_id: str,
        *,
        name: str,
        client: str = "",
        api: str | None = None,
        span: Span | None = None,
        engine_headers: dict[str, str] | None = None,
        started: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.name = name  # what was called: `POST /v1/...`, `salience.v1.Salience/Generate`
        self.client = client  # host:port
        self.api = api  # one of OPERATIONS, or None: not an inference API's call
        self.span = span
        # The W3C context of `span`, for the engine's span of each engine request.
        self.engine_headers = engine_headers
        self.started = time.monotonic() if started is None else started
        self.method = ""
        self.route = ""
        self.tenant: str | None = None
        self.model: str | None = None
        self.status = 0  # the HTTP status answered; 0: not HTTP
        self.error: SwitchboardError | None = None
        self.cancelled = False
        # Its engine work goes on under another record (a background response's run),
        # which its metrics are counted with: this one is not counted by itself.
        self.handed_off = False
        self.admitted: float | None = None
        self.built: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.ended: float | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.finish_reasons: tuple[str, ...] = ()
        self.traces: list[EngineTrace] | None = None
        self.first_request: GenerationRequest | None = None  # traced: its sampling

    # -- filled by the road ------------------------------------------------------------

    def admitted_now(self) -> None:
        if self.admitted is None:
            self.admitted = time.monotonic()

    def built_now(self) -> None:
        self.built = time.monotonic()

    def first_token_now(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def last_token_now(self) -> None:
        self.last_token = time.monotonic()

    def for_engine(self, request: GenerationRequest) -> GenerationRequest:
        """`request` as the engine runs it: its id after this request's id; traced, with
        the context that makes the engine's span a child of this one's."""
        if self.model is None:
            self.model = request.lora_name
        headers = self.engine_headers
        if headers is None:
            return replace(request, request_id=f"{self.request_id}-{request.request_id}")
        trace = EngineTrace(headers)
        if self.traces is None:
            self.traces = []
            self.first_request = request
        self.traces.append(trace)
        return replace(request, request_id=f"{self.request_id}-{request.request_id}", trace=trace)

    def count(self, accounting: Accounting) -> None:
        """The call's tokens and finishes, as its exchange counted them."""
        usage = accounting.usage()
        self.input_tokens = usage.prompt_tokens
        self.output_tokens = usage.completion_tokens
        self.cached_tokens = usage.cached_tokens
        self.finish_reasons = tuple(s.finish_reason for s in accounting.states if s.finish_reason)

    def count_event(self, event: TokenEvent) -> None:
        """One engine event's tokens and finish, for a call that has no exchange to count
        them (Evergreen's GENERATE, Salience's Generate)."""
        self.output_tokens += len(event.token_ids)
        if event.prompt_token_ids is not None:
            self.input_tokens += len(event.prompt_token_ids)
            self.cached_tokens += event.num_cached_tokens
        if event.finish_reason is not None:
            self.finish_reasons += (event.finish_reason,)

    def failed(self, error: SwitchboardError) -> None:
        if self.error is None:
            self.error = error

    # -- read when it is reported --------------------------------------------------------

    @property
    def outcome(self) -> str:
        if self.cancelled:
            return CANCELLED
        error, status = self.error, self.status
        if isinstance(error, Overloaded):
            return REFUSED
        if error is not None:
            return FAILED if error.http_status >= 500 else CLIENT_ERROR
        if status == 499:  # the client left before its answer (nginx's code)
            return CANCELLED
        if status >= 500:
            return FAILED
        if status >= 400:
            return CLIENT_ERROR
        return OK

    @property
    def ttft_s(self) -> float | None:
        """From the request's arrival to its first token."""
        return None if self.first_token is None else self.first_token - self.started

    @property
    def duration_s(self) -> float:
        end = self.ended if self.ended is not None else time.monotonic()
        return end - self.started
