"""What Completions and Chat share: choices (one engine request per prompt x choice),
OpenAI's envelope and usage, the stream's usage chunk and its `[DONE]`, an error in the
stream in OpenAI's shape.

An exchange is built from a validated body (raising `app.errors` on bad input, so errors
happen before a stream starts; the limits themselves are `app.engine.validation`'s),
exposes `plans` (the engine requests, with the prompt each continues), and is then fed
the engine's events per choice index: streamed, `events(index, event)` gives the chunks
to send (`chunks` the same as plain dicts); not streamed, `feed(index, event)` collects
and `response()` is the body (`result()`, as `app.protocols.exchange.Exchange` names it).
Counting is `app.protocols.accounting`'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from app.engine.models import ServedModel
from app.errors import SwitchboardError
from app.protocols.accounting import Accounting, RequestState
from app.protocols.exchange import Event
from app.protocols.openai.errors import error_body
from schemas.openai import SamplingFields


@dataclass(frozen=True, slots=True)
class ChoicePlan:
    index: int  # the choice's index in the response
    prompt_index: int
    request: GenerationRequest


class ChoicesExchange(ABC):
    """Bookkeeping common to Completions and Chat exchanges."""

    object_name: str = ""
    chunk_object_name: str = ""
    ends_with_done = True

    def __init__(
        self,
        body: SamplingFields,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        response_id: str,
        created: int,
        served: ServedModel,
    ) -> None:
        self.body = body
        self.info = info
        self.tokenizer = tokenizer
        self.response_id = response_id
        self.created = created
        self.model = served.name
        self.lora_name = served.lora_name
        self.plans: list[ChoicePlan] = []
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def _set_plans(self, plans: Sequence[tuple[int, GenerationRequest]]) -> None:
        """The engine requests, each with the index of the prompt it continues."""
        self.plans = [ChoicePlan(i, prompt, request) for i, (prompt, request) in enumerate(plans)]
        self.accounting = Accounting([plan.prompt_index for plan in self.plans])
        # Bound once: called for every token.
        self._account = self.accounting.account

    @property
    def states(self) -> list[RequestState]:
        return self.accounting.states

    @property
    def requests(self) -> list[GenerationRequest]:
        return [plan.request for plan in self.plans]

    def usage(self) -> dict[str, int]:
        usage = self.accounting.usage()
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": self.chunk_object_name if chunk else self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if not chunk:
            body["usage"] = self.usage()
        elif self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self) -> dict[str, Any] | None:
        """The final chunk of a stream when `stream_options.include_usage` is set."""
        if not self.include_usage:
            return None
        body = self._envelope([], chunk=True)
        body["usage"] = self.usage()
        return body

    @abstractmethod
    def events(self, index: int, event: TokenEvent) -> list[Event]:
        """The stream's chunks for one event of choice `index`, as `(None, chunk)`
        (OpenAI's events are bare `data:` lines)."""

    def chunks(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        return [dict(chunk) for _, chunk in self.events(index, event)]

    @abstractmethod
    def feed(self, index: int, event: TokenEvent) -> None:
        """Collect one event of choice `index` (not streamed)."""

    @abstractmethod
    def response(self) -> dict[str, Any]:
        """The whole body, once every choice has ended (not streamed)."""

    # -- app.protocols.exchange.Exchange ---------------------------------------------------

    def opening(self) -> list[Event]:
        return []

    def closing(self) -> list[Event]:
        usage = self.usage_chunk()
        return [] if usage is None else [(None, usage)]

    def failure(self, error: SwitchboardError) -> list[Event]:
        return [(None, error_body(error))]

    def result(self) -> dict[str, Any]:
        return self.response()
