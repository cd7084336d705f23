"""One request of a batch, answered as its endpoint alone would answer it, on the road
every call takes (`app.sessions.calls`), in the batch lane.

`Endpoints.answer(endpoint, body)` checks the body as the endpoint's route does (the
same model and the same messages: `app.protocols.bodies`), admits it in the lane
(protocol `batch`, `BATCH_PRIORITY`: `app.batches.lane`), builds its exchange in the
prompt thread, runs it on the engine with every engine request at the lane's priority, and
gives back its `Answer`: the status and the body the endpoint would have answered (an
error in the API's own shape included, as its route renders it). A Responses request
is stored, and extends its conversation, as `/v1/responses` would.

What is no answer, and raises `Retry` (the request is to run again, here later or on
another replica): the server's own trouble, never the request's: a full queue or a
draining server (`Overloaded`), the engine or a store out of reach (`Unavailable`,
`EngineDead`). A request streamed, or a Responses request in the background, is not
for a batch: a 400.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.admission import Admission
from app.batches.lane import BATCH_PRIORITY, PROTOCOL
from app.engine.base import Engine, GenerationRequest, TokenEvent
from app.engine.models import served_by
from app.errors import (
    EngineDead,
    InvalidRequest,
    Overloaded,
    SwitchboardError,
    Unavailable,
    client_error,
)
from app.protocols.accounting import Accounting
from app.protocols.anthropic.errors import error_body as anthropic_error_body
from app.protocols.anthropic.errors import error_kind
from app.protocols.anthropic.exchange import MessagesExchange
from app.protocols.anthropic.messages import admission_bound
from app.protocols.bodies import validate
from app.protocols.exchange import Event, Exchange
from app.protocols.openai.admission_units import admission_units
from app.protocols.openai.chat import ChatExchange
from app.protocols.openai.completions import CompletionExchange
from app.protocols.openai.errors import error_body as openai_error_body
from app.sessions.calls import Call, collect_call, start_call
from app.sessions.responses import CallLane, Responses
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from app.tenants import Principal, Role, Tenants
from schemas.anthropic import AnthropicMessagesRequest
from schemas.openai import ChatCompletionRequest, CompletionRequest
from schemas.openai_responses import ResponsesRequest

# Batch requests whose prompts are being built at once. The prompt thread is the one
# interactive calls build theirs in, first come first served: a lane widening by a
# hundred would queue a hundred builds ahead of the next interactive request (its TTFT
# up by their time); two keep the thread fed between batch builds without a queue.
BUILDING = 2


class Retry(Exception):
    """The request did not run to an answer, for a reason of the server's own."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Mapping[str, Any]
    tokens: tuple[int, int] = (0, 0)  # input, output (of an answer that succeeded)

    @property
    def ok(self) -> bool:
        return self.status == 200


class _InLane:
    """An exchange whose engine requests run at the lane's priority; the rest is its own."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        self.requests: Sequence[GenerationRequest] = [
            replace(r, priority=BATCH_PRIORITY) for r in exchange.requests
        ]
        self.ends_with_done = exchange.ends_with_done

    @property
    def accounting(self) -> Accounting:
        return self._exchange.accounting

    def opening(self) -> list[Event]:
        return self._exchange.opening()

    def events(self, index: int, event: TokenEvent) -> list[Event]:
        return self._exchange.events(index, event)

    def closing(self) -> list[Event]:
        return self._exchange.closing()

    def failure(self, error: SwitchboardError) -> list[Event]:
        return self._exchange.failure(error)

    def feed(self, index: int, event: TokenEvent) -> None:
        self._exchange.feed(index, event)

    def result(self) -> dict[str, Any]:
        return self._exchange.result()


def _tokens(body: Mapping[str, Any]) -> tuple[int, int]:
    usage = body.get("usage") or {}
    taken = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    made = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return int(taken or 0), int(made or 0)


class Endpoints:
    """The endpoints a batch's requests may name, on one engine and admission; each
    request runs as its batch's tenant (`tenants`: the keyring's), as a call with that
    tenant's key would."""

    def __init__(
        self,
        engine: Engine,
        admission: Admission,
        responses: Callable[[], Responses],
        tenants: Tenants,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.telemetry = telemetry
        self.tenants = tenants
        self._responses = responses
        self._lane = CallLane(PROTOCOL, BATCH_PRIORITY, asyncio.Semaphore(BUILDING))

    async def answer(self, endpoint: str, body: Any, *, request_id: str, tenant: str) -> Answer:
        """The endpoint's answer to `body`; `Retry` if the server could not give one. It
        is reported as a request of its own (`request_id`, the batch's `tenant`): its
        access-log line and span; not counted with the interactive requests of its API."""
        record = self._open(request_id, endpoint, tenant)
        try:
            if not isinstance(body, dict):
                raise InvalidRequest("The request's body must be a JSON object")
            if body.get("stream"):
                raise InvalidRequest("A batch's request is not streamed", param="stream")
            principal = self.tenants.principal(tenant, Role.TENANT)
            result = await self._run(endpoint, body, record, principal)
        except (Overloaded, Unavailable, EngineDead) as exc:
            record.failed(exc)
            raise Retry(exc.message) from exc
        except asyncio.CancelledError:
            record.cancelled = True
            raise
        except Exception as exc:
            error = client_error(exc)
            record.failed(error)
            if isinstance(error, Overloaded | Unavailable | EngineDead):
                raise Retry(error.message) from exc
            return self._refused(endpoint, error)
        finally:
            if self.telemetry is not None:
                self.telemetry.close(record)
        return Answer(200, result, _tokens(result))

    def _open(self, request_id: str, endpoint: str, tenant: str) -> RequestRecord:
        name = f"batch POST {endpoint}"
        if self.telemetry is None:
            record = RequestRecord(request_id, name=name)
        else:
            record = self.telemetry.open(request_id, name=name)
        record.tenant = tenant
        return record

    @staticmethod
    def _refused(endpoint: str, error: SwitchboardError) -> Answer:
        if endpoint == "/v1/messages":
            return Answer(error_kind(error)[1], anthropic_error_body(error))
        return Answer(error.http_status, openai_error_body(error))

    async def _run(
        self, endpoint: str, body: dict[str, Any], record: RequestRecord, principal: Principal
    ) -> dict[str, Any]:
        engine = self.engine
        info, tokenizer, created = engine.info, engine.tokenizer, int(time.time())
        if endpoint == "/v1/responses":
            return await self._response(validate(ResponsesRequest, body), record, principal)
        if endpoint == "/v1/messages":
            message = validate(AnthropicMessagesRequest, body)
            served = served_by(engine, message.model)
            message_id = f"msg_{uuid.uuid4().hex}"
            return await self._collect(
                record,
                principal,
                [admission_bound(message)],
                lambda: MessagesExchange(
                    message, info, tokenizer, message_id=message_id, served=served
                ),
            )
        if endpoint == "/v1/chat/completions":
            chat = validate(ChatCompletionRequest, body)
            served = served_by(engine, chat.model)
            chat_id = f"chatcmpl-{uuid.uuid4().hex}"
            return await self._collect(
                record,
                principal,
                admission_units(chat),
                lambda: ChatExchange(
                    chat, info, tokenizer, response_id=chat_id, created=created, served=served
                ),
            )
        if endpoint == "/v1/completions":
            completion = validate(CompletionRequest, body)
            served = served_by(engine, completion.model)
            completion_id = f"cmpl-{uuid.uuid4().hex}"
            return await self._collect(
                record,
                principal,
                admission_units(completion),
                lambda: CompletionExchange(
                    completion,
                    info,
                    tokenizer,
                    response_id=completion_id,
                    created=created,
                    served=served,
                ),
            )
        raise InvalidRequest(f"No batch endpoint {endpoint}")

    async def _collect(
        self,
        record: RequestRecord,
        principal: Principal,
        units: Sequence[int],
        build: Callable[[], Exchange],
    ) -> dict[str, Any]:
        call = await start_call(
            self.admission,
            record,
            protocol=PROTOCOL,
            units=units,
            priority=BATCH_PRIORITY,
            principal=principal,
            build=lambda: self._lane.built(lambda: _InLane(build())),
        )
        result: dict[str, Any] = await collect_call(self.engine, call)
        return result

    async def _response(
        self, body: ResponsesRequest, record: RequestRecord, principal: Principal
    ) -> dict[str, Any]:
        if body.background:
            raise InvalidRequest(
                "A batch's request does not run in the background", param="background"
            )
        responses = self._responses()
        call = await responses.start(principal, body, record, lane=self._lane)
        hooks = responses.hooks(principal, call, body, None)
        lane = Call(_InLane(call.exchange), call.tickets, record)
        result: dict[str, Any] = await collect_call(self.engine, lane, hooks)
        return result
