"""`vllm.grpc.engine.VllmEngine` (smg-grpc-proto) over native gRPC: the worker side of
SMG's gRPC mode, what `vllm serve --grpc` serves through smg-grpc-servicer. A thin
adapter: the protocol is `app.protocols.smg`'s, the road `app.sessions.calls`'.

- `Generate`: admission (one unit per choice, protocol `smg`, before any prompt work;
  refused UNAVAILABLE with the retry hint), the request built in the prompt thread
  (a bad one INVALID_ARGUMENT, a prompt past the context too, before any engine
  request); a refusal or a bad request is the call's status alone, its `x-request-id`
  in the trailers (initial metadata goes once admitted: SMG retries a call whose start
  fails on another worker, streamed or not, but passes a stream's error on to its
  client), then the engine's events
  pushed from its loop into an outbox the call's writer empties: a stream's first chunk
  goes at once, then at most one every `--grpc-stream-interval-ms` (10), each with every
  token made meanwhile, since a gRPC message costs the worker 90-135 us, about the
  rest of a token's work at 64 streams (docs/grpc.md); past `--grpc-stream-chunks-per-interval`
  (8) streamed choices the interval grows in proportion, so the worker's chunks a
  second stay about the same however many stream.
  A client that cancels the call (SMG drops a stream whose client left) aborts its
  engine requests; a drain's cut ends the call UNAVAILABLE.
- `Abort`: the engine requests running under the named `request_id`s end with finish
  reason "abort" (their streams' Complete says so), the caller's tenant's only; an
  unknown id, or another tenant's, is no error and stops nothing (the same answer).
- `HealthCheck`: unhealthy while the engine fails its check or the server drains, so
  SMG stops sending to a replica that is going away; the grpc.health service says the
  same for this service's name (`app.routes.grpc.server`).
- `GetModelInfo`, `GetServerInfo`, `GetLoads`: the served model's facts, this server's
  state and the engine's (KV block size and dtype, model dtype, running window, reasoning
  parser: what SMG pairs and counts workers by), its queue (admission's) and KV-cache
  usage (vLLM's gauge).
- `SubscribeKvEvents`: vLLM's KV-cache events (its ZMQ publisher, `--kv-events-config`)
  relayed as one stream of `KvEventBatch`es, each with this server's load record, what
  SMG's `cache_aware` policy routes by; the relay is smg-grpc-servicer's own
  (`kv_relay.relay`, as `vllm serve --grpc` runs it), fed the publishers the engine
  reports. The events carry every tenant's token ids, so only a full key reads them
  (PERMISSION_DENIED otherwise); UNIMPLEMENTED without a publisher (SMG then stops
  asking); at most `MAX_KV_SUBSCRIBERS` at once (RESOURCE_EXHAUSTED past it: each one
  decodes every batch on the event loop). A subscription is a session: none opens
  while the server drains, and the drain ends each one UNAVAILABLE.
- `GetTokenizer`: the model directory's tokenizer files as a zip, streamed in chunks,
  the archive built once off the event loop (smg-grpc-servicer's `tokenizer_bundle`,
  taken as it is: it knows which files SMG's tokenizer loader reads).
- `Embed`, `FlushCache`, `StartProfile`, `StopProfile`: UNIMPLEMENTED with a message (a
  generation model; no cache flush or profiler over this transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_servicer.kv_relay import Engine as Publisher
from smg_grpc_servicer.kv_relay import RankSource, endpoint_for_rank, relay
from smg_grpc_servicer.load_record import engine_load_from
from smg_grpc_servicer.tokenizer_bundle import tokenizer_bundle, tokenizer_chunks

from app import __version__
from app.admission import Admission, ProtocolName, text_tokens_bound
from app.auth import reading_every_tenant
from app.drain import Drain
from app.engine.base import Engine, TokenEvent
from app.errors import (
    ContextLengthExceeded,
    EngineError,
    FailedPrecondition,
    ResourceExhausted,
    SwitchboardError,
    Unimplemented,
    client_error,
)
from app.metrics import kv_cache_usage
from app.objects import AppObjects
from app.protocols.smg import SmgGenerate, model_info
from app.routes.grpc.calls import (
    Context,
    Service,
    answer_id,
    caller_of,
    decode,
    end,
    principal,
    register,
)
from app.sessions.calls import in_prompt_thread, start_call
from app.sessions.generations import run_generations
from app.sessions.lifetime import SessionLifetime
from app.sessions.named import NamedRequests
from app.telemetry.logs import logging_as
from app.telemetry.record import RequestRecord, counted
from app.telemetry.reports import Telemetry

_SERVICE = pb.DESCRIPTOR.services_by_name["VllmEngine"]
PROTOCOL = ProtocolName.SMG
# KV-event subscriptions open at once: a router subscribes once per worker.
MAX_KV_SUBSCRIBERS = 8


class _Outbox:
    """A call's engine events, per choice, until its writer takes them. Filled from the
    engine's loop; `ready` wakes the writer (streamed: on every event but while it
    holds; not streamed: only when a choice ends, the only time there is something to
    send)."""

    def __init__(self, stream: bool) -> None:
        self.pending: dict[int, list[TokenEvent]] = {}
        self.ready = asyncio.Event()
        self.ending = False  # a choice's last event is pending: send it without waiting
        self._stream = stream
        self._holding = False

    def put(self, index: int, event: TokenEvent) -> None:
        events = self.pending.get(index)
        if events is None:
            self.pending[index] = [event]
        else:
            events.append(event)
        if event.finish_reason is not None:
            self.ending = True
            self.ready.set()
        elif self._stream and not self._holding:
            self.ready.set()

    async def hold(self, seconds: float) -> None:
        """Let events gather for `seconds`, or until a choice ends (or the run does: its
        done callback sets `ready`), whichever comes first: a stream's last chunk and
        its Complete never wait out an interval (a grown one reaches 100 ms and more)."""
        self._holding = True
        self.ready.clear()
        timer = asyncio.get_running_loop().call_later(seconds, self.ready.set)
        try:
            await self.ready.wait()
        finally:
            timer.cancel()
            self._holding = False

    def take(self) -> dict[int, list[TokenEvent]]:
        taken, self.pending = self.pending, {}
        self.ready.clear()
        self.ending = False
        return taken


def _units(request: pb.GenerateRequest) -> list[int]:
    """Admission's units: one per choice, each bounded by the prompt's tokens."""
    if request.WhichOneof("input") == "text":
        bound = text_tokens_bound(request.text)
    else:
        bound = len(request.tokenized.input_ids)
    return [bound] * max(request.sampling_params.n, 1)


async def abort(context: Context, exc: BaseException, request_id: str | None = None) -> NoReturn:
    """End the call with `exc`'s status, a prompt past the context INVALID_ARGUMENT (as
    vLLM's servicer ends it): SMG answers RESOURCE_EXHAUSTED with a 429 it may retry."""
    error = client_error(exc)
    code = "INVALID_ARGUMENT" if isinstance(error, ContextLengthExceeded) else error.grpc_status
    await end(context, error, code, request_id)


def _read_config(model_path: str) -> dict[str, Any]:
    try:
        data = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class _VllmEngine:
    def __init__(
        self,
        engine: Engine,
        admission: Admission,
        drain: Drain,
        named: NamedRequests,
        config: dict[str, Any],
        interval_s: float,
        chunks_per_interval: int,
        telemetry: Telemetry,
    ) -> None:
        self._telemetry = telemetry
        self._interval_s = interval_s
        self._chunks_per_interval = chunks_per_interval
        self._streaming = 0  # the streamed choices of the calls now writing
        self._engine = engine
        self._admission = admission
        self._drain = drain
        self._named = named
        self._model_info = model_info(engine.info, config)
        self._started = time.time()
        self._last_receive = 0.0
        self._kv_subscribers = 0

    def behaviours(self) -> dict[str, Any]:
        return {
            "Generate": self.generate,
            "Embed": _unimplemented("Embed: this worker serves a generation model"),
            "HealthCheck": self.health_check,
            "FlushCache": _unimplemented("FlushCache is not served by this worker"),
            "StartProfile": _unimplemented("profiling is not served by this worker"),
            "StopProfile": _unimplemented("profiling is not served by this worker"),
            "Abort": self.abort,
            "GetModelInfo": self.get_model_info,
            "GetServerInfo": self.get_server_info,
            "GetLoads": self.get_loads,
            "GetTokenizer": self.get_tokenizer,
            "SubscribeKvEvents": self.subscribe_kv_events,
        }

    async def generate(self, data: bytes, context: Context) -> None:
        """One call, a request of its own to telemetry (`app.telemetry`): its
        `x-request-id` and `traceparent` metadata, its record and span."""
        caller = caller_of(context)
        record = self._telemetry.open_call(caller, name=f"{_SERVICE.full_name}/Generate", api="smg")
        try:
            with logging_as(record.request_id):
                await self._generate(data, context, record)
        except asyncio.CancelledError:  # the client has gone
            record.cancelled = True
            raise
        finally:
            self._telemetry.close(record)

    async def _generate(self, data: bytes, context: Context, record: RequestRecord) -> None:
        engine = self._engine
        tenant = principal().tenant
        try:
            request = decode(pb.GenerateRequest, data)
            self._last_receive = time.time()
            info, tokenizer = engine.info, engine.tokenizer
            call = await start_call(
                self._admission,
                record,
                protocol=PROTOCOL,
                units=_units(request),
                priority=0,
                principal=principal(),
                build=lambda: in_prompt_thread(lambda: SmgGenerate(request, info, tokenizer)),
            )
        except Exception as exc:
            # Refused before a byte of the answer: the status alone (a trailers-only
            # response), which SMG's client sees as the call's start failing, and so
            # retries on another worker, streamed or not; after initial metadata it
            # would be a stream that broke, cut at its client (a draining replica's
            # refusals, in a roll).
            record.failed(client_error(exc))
            await abort(context, exc, record.request_id)
        await answer_id(context, record.request_id)
        exchange: SmgGenerate = call.exchange
        outbox = _Outbox(exchange.stream)
        # Straight to grpcio (not `calls.Writer`, whose task per write costs more than
        # the write): one writer, this task, and nothing is sent once it is cancelled.
        write = context.write
        self._named.add(tenant, exchange.name, call.tickets)
        with call.tickets:
            runner = asyncio.ensure_future(
                run_generations(
                    engine, exchange.requests, call.tickets, counted(record, outbox.put)
                )
            )
            runner.add_done_callback(lambda _: outbox.ready.set())
            paced = exchange.stream and self._interval_s > 0
            choices = len(exchange.requests) if paced else 0
            self._streaming += choices
            sent = False
            try:
                while True:
                    await outbox.ready.wait()
                    if sent and paced and not (outbox.ending or runner.done()):
                        # A whole interval from the wake-up, not what is left of it since
                        # the last chunk: steps about as long as the interval then share a
                        # chunk (a pace from the last chunk sent one a step, each token
                        # alone: 1.5x the CPU a token at 16 streams, measured).
                        await outbox.hold(self._interval())  # what comes meanwhile goes too
                    sent = True
                    done = runner.done()
                    for index, events in outbox.take().items():
                        for message in exchange.messages(index, events):
                            await write(message)
                    if done:
                        break
                runner.result()
                record.last_token_now()
            except Exception as exc:
                record.failed(client_error(exc))
                await abort(context, exc)
            finally:
                self._streaming -= choices
                if not runner.done():
                    runner.cancel()
                with contextlib.suppress(BaseException):
                    await runner

    def _interval(self) -> float:
        """A stream's pause between chunks: `--grpc-stream-interval-ms`, grown in
        proportion past `chunks_per_interval` streamed choices, so that all of them
        together send about that many chunks an interval however many stream: each
        chunk carries more tokens as the server fills (a message costs about the rest
        of a token's work), while a few streams still get theirs as they come."""
        limit = self._chunks_per_interval
        if not limit or self._streaming <= limit:
            return self._interval_s
        return self._interval_s * self._streaming / limit

    async def abort(self, data: bytes, context: Context) -> pb.AbortResponse:
        try:
            request = decode(pb.AbortRequest, data)
            await self._named.abort(principal().tenant, request.request_ids)
        except Exception as exc:
            await abort(context, exc)
        return pb.AbortResponse()

    async def health_check(self, data: bytes, context: Context) -> pb.HealthCheckResponse:
        if self._drain.draining:
            return pb.HealthCheckResponse(healthy=False, message="draining")
        try:
            await self._engine.check_health()
        except Exception as exc:
            message = exc.message if isinstance(exc, SwitchboardError) else "engine unhealthy"
            return pb.HealthCheckResponse(healthy=False, message=message)
        return pb.HealthCheckResponse(healthy=True, message="Health")

    async def get_model_info(self, data: bytes, context: Context) -> pb.GetModelInfoResponse:
        return self._model_info

    async def get_server_info(self, data: bytes, context: Context) -> pb.GetServerInfoResponse:
        info = self._engine.info
        return pb.GetServerInfoResponse(
            active_requests=self._engine.num_running_requests(),
            is_paused=self._drain.draining,
            last_receive_timestamp=self._last_receive,
            uptime_seconds=time.time() - self._started,
            server_type="vllm-grpc",
            data_parallel_size=1,
            kv_cache_dtype=info.kv_cache_dtype,
            block_size=info.kv_block_size,
            model_dtype=info.model_dtype,
            max_num_seqs=info.max_num_seqs,
            engine_reasoning_parser=info.reasoning_parser,
            constrained_decoding_start=info.grammar_start,
        )

    async def get_loads(self, data: bytes, context: Context) -> pb.GetLoadsResponse:
        return pb.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(),
            version=self._engine.info.engine_version or __version__,
            dp_rank_count=1,
            loads=[self._load()],
        )

    def _load(self) -> pb.SchedulerLoad:
        """This server's load as `GetLoads` and the KV-event stream's record report it:
        admission's queue and vLLM's KV-cache usage."""
        admission = self._admission
        waiting = sum(admission.queued().values())
        total = admission.in_flight
        return pb.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=max(total - waiting, 0),
            num_waiting_reqs=waiting,
            num_total_reqs=total,
            token_usage=kv_cache_usage(),
            num_waiting_uncached_tokens=admission.queued_tokens,
        )

    def _load_record(self, dp_rank: int | None) -> common_pb2.EngineLoad:
        """The load record the KV-event relay stamps on its batches (smg-grpc-servicer's
        `LoadSource`; one rank here, so `dp_rank` changes nothing), with the queued
        prompt tokens `GetLoads` reports."""
        return engine_load_from(self._load(), queued_token_work=True)

    async def subscribe_kv_events(self, data: bytes, context: Context) -> None:
        lifetime = SessionLifetime(self._drain)
        task = asyncio.current_task()
        assert task is not None
        relaying = False
        said: SwitchboardError | None = None  # the drain's goodbye, once said

        async def goodbye(refusal: SwitchboardError) -> None:
            nonlocal said
            if relaying:  # once the relay is ending by itself, its own status goes out
                said = refusal
                task.cancel()

        try:
            request = decode(common_pb2.SubscribeKvEventsRequest, data)
            lifetime.open(lambda: reading_every_tenant(principal()))
            sources = self._engine.kv_event_sources()
            if not sources:
                raise Unimplemented(
                    "KV cache events are not published: start the server with "
                    '--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq"}\''
                )
            if self._kv_subscribers >= MAX_KV_SUBSCRIBERS:
                raise ResourceExhausted(
                    f"{MAX_KV_SUBSCRIBERS} KV-event subscriptions are open: the most at once"
                )
        except Exception as exc:
            await abort(context, exc)
        first = sources[min(sources)]
        hwm = first.get("hwm")
        self._kv_subscribers += 1
        try:
            async with lifetime.serving(goodbye):
                # The relay ends by itself on a cancellation (its own or the drain's).
                batches = relay(
                    _rank_sources(sources),
                    Publisher.VLLM,
                    request.start_sequence_number,
                    context,
                    topic=str(first.get("topic") or ""),
                    hwm=hwm if isinstance(hwm, int) else None,
                    load_source=self._load_record,
                )
                relaying = True
                try:
                    async for batch in batches:
                        await context.write(batch)
                except asyncio.CancelledError:
                    if said is None:
                        raise
                finally:
                    relaying = False
                    await batches.aclose()
        finally:
            self._kv_subscribers -= 1
        if said is not None:
            if task.cancelling():
                task.uncancel()  # our goodbye's, consumed here
            await abort(context, said)

    async def get_tokenizer(
        self, data: bytes, context: Context
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        try:
            archive, sha256 = await tokenizer_bundle(self._engine.info.model_path)
        except FileNotFoundError as exc:  # its text names the model's directory: logged only
            await abort(
                context, FailedPrecondition.withholding("The model has no tokenizer files", exc)
            )
        except Exception as exc:
            await abort(
                context,
                EngineError.withholding("The tokenizer bundle failed", exc, level=logging.ERROR),
            )
        for chunk in tokenizer_chunks(archive, sha256):
            yield chunk


def _unimplemented(message: str) -> Any:
    async def refuse(data: bytes, context: Context) -> None:
        await abort(context, Unimplemented(message))

    return refuse


def _rank_sources(configs: Mapping[int, Mapping[str, object]]) -> list[RankSource]:
    """Where to subscribe to each rank's publisher, and ask it for replay: the endpoints
    the engine reports are the rank's own already (a bind wildcard read as loopback)."""
    sources = []
    for rank, config in sorted(configs.items()):
        replay = config.get("replay_endpoint")
        sources.append(
            RankSource(
                rank=rank,
                endpoint=endpoint_for_rank(str(config.get("endpoint") or ""), 0),
                replay_endpoint=endpoint_for_rank(str(replay), 0) if replay else None,
            )
        )
    return sources


def _add(server: grpc.aio.Server, objects: AppObjects) -> None:
    config = _read_config(objects.engine.info.model_path)
    interval = objects.settings.grpc_stream_interval_ms / 1000
    servicer = _VllmEngine(
        objects.engine,
        objects.admission,
        objects.drain,
        objects.named_requests,
        config,
        interval,
        objects.settings.grpc_stream_chunks_per_interval,
        objects.telemetry,
    )
    register(server, _SERVICE, servicer.behaviours())


SERVICE = Service(_SERVICE.full_name, _add)
