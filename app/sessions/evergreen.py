"""One Evergreen session driven on the engine, over any transport.

`EvergreenRun.serve(messages)` takes the client's `SessionMessage`s, feeds them to the
core (`app.protocols.evergreen.lifecycle.Lifecycle` around the node state machine), runs
each action the core releases as a task of its own on the shared engine, and sends the
output node's fragments through `send` as the engine produces text. It returns when the
session is over, once every action has stopped (each running engine request aborted):
the failure to report (the transport sends `abort_message(failure)` and ends its stream
with the failure's code), or None.

- `messages` ending means the client left (a websocket), or, with `drain=True`, that the
  client will send nothing more but still listens (a gRPC half-close): the session then
  ends when no action runs. A `SwitchboardError` raised by `messages` (a frame that does
  not decode) fails the session like a broken rule.
- `send` must not raise when the client has gone: it drops the message (the transport's
  reading side sees the end).
- `file://` refs are read in a worker thread, under the configured root, each at most
  the session's byte budget; the core checks the input's total (`inputs.join`). The
  prompt is tokenized in a worker thread too (an input may be megabytes of text).
- Any exception that is not a `SwitchboardError` fails the session as `InternalError`
  (`client_error`), never with the exception's text.
- Each action that generates is one unit of admission (`app.admission`), asked before its
  files are read or its prompt tokenized (bounded by its inline bytes); a refusal fails
  the session as `Overloaded` (ABORT UNAVAILABLE, with the retry hint). `stop(failure)`
  ends the session from outside (the drain's goodbye) as if an action had failed.
- Each action that generates is a request to telemetry (`app.telemetry`, with a
  `telemetry` and the session's `caller`): its record, span and access-log line, its id
  the session's numbered, reported once the action has ended.

`serve_session` is one session's whole life on a transport (`app.sessions.lifetime`):
its opening (a refusal is the failure's ABORT, then the transport's `end`), the session
served, the drain's goodbye (`stop` with the drain's refusal), and its end (a failure's
ABORT, then `end`: a close code, a gRPC status). A transport gives it its frames in and
out and its way to end; nothing else.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path

from app.admission import Admission, ProtocolName, Ticket, generate, text_tokens_bound
from app.config import Settings
from app.engine.base import Engine, GenerationRequest
from app.errors import Aborted, InvalidRequest, ResourceExhausted, SwitchboardError, client_error
from app.protocols.evergreen import inputs
from app.protocols.evergreen.generate import (
    OUTPUT_METADATA,
    GeneratePlan,
    plan_action,
    prompt_token_ids,
)
from app.protocols.evergreen.lifecycle import Cause, Lifecycle, abort_message
from app.protocols.evergreen.refs import FileRef
from app.protocols.evergreen.session import Limits, Ready, Session
from app.sessions.calls import in_prompt_thread
from app.sessions.lifetime import SessionLifetime
from app.sessions.tasks import TaskGroup
from app.telemetry.callers import Caller
from app.telemetry.logs import logging_as
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from app.tenants import Principal
from schemas import evergreen_service_pb2 as service_pb

Send = Callable[[service_pb.SessionMessage], Awaitable[None]]
End = Callable[[SwitchboardError], Awaitable[None]]


async def serve_session(
    lifetime: SessionLifetime,
    authenticate: Callable[[], Principal],
    start: Callable[[Principal], EvergreenRun],
    messages: AsyncIterable[service_pb.SessionMessage],
    send: Send,
    end: End,
    *,
    drain: bool = False,
) -> None:
    """One Evergreen session on a transport, from its opening to its end: `start` makes
    its run for the caller once the session may open; `messages` and `drain` as
    `EvergreenRun.serve` takes them; a refusal or a failure is its ABORT through `send`,
    then `end(failure)`."""
    try:
        principal = lifetime.open(authenticate)
    except SwitchboardError as refused:
        await send(abort_message(refused))
        await end(refused)
        return
    run = start(principal)

    async def goodbye(refusal: SwitchboardError) -> None:
        run.stop(refusal)

    async with lifetime.serving(goodbye):
        failure = await run.serve(messages, drain=drain)
        if failure is not None:
            await send(abort_message(failure))
            await end(failure)


class EvergreenRun:
    def __init__(
        self,
        engine: Engine,
        admission: Admission,
        limits: Limits,
        file_root: Path | None,
        send: Send,
        telemetry: Telemetry | None = None,
        caller: Caller | None = None,
        principal: Principal | None = None,
    ) -> None:
        self._engine = engine
        self._principal = principal
        self._admission = admission
        self._file_root = file_root
        self._send = send
        self._telemetry = telemetry
        self._caller = caller
        session: Session[GeneratePlan] = Session(
            limits, lambda action: plan_action(action, engine.info, engine.has_model)
        )
        self.lifecycle = Lifecycle(session)
        self._actions = TaskGroup()
        self._over = asyncio.Event()  # set once the session is no longer live

    @classmethod
    def from_settings(
        cls,
        engine: Engine,
        admission: Admission,
        settings: Settings,
        send: Send,
        telemetry: Telemetry | None = None,
        caller: Caller | None = None,
        principal: Principal | None = None,
    ) -> EvergreenRun:
        """A session under the configured limits and file root (every transport's), of
        `principal` (its GENERATEs admitted under its tenant's limits)."""
        limits = Limits(
            max_nodes=settings.evergreen_max_nodes,
            max_bytes=settings.evergreen_max_bytes,
            max_pending_actions=settings.evergreen_max_pending_actions,
            max_depth=settings.evergreen_max_depth,
            files_allowed=settings.evergreen_file_root is not None,
        )
        return cls(
            engine,
            admission,
            limits,
            settings.evergreen_file_root,
            send,
            telemetry,
            caller,
            principal,
        )

    async def serve(
        self, messages: AsyncIterable[service_pb.SessionMessage], *, drain: bool = False
    ) -> SwitchboardError | None:
        reader = asyncio.create_task(self._read(messages, drain))
        try:
            await self._over.wait()
        finally:
            # Stopped here, before any await: no action can start after the snapshot of
            # the tasks to cancel. Shielded (in aclose): even when this is cancelled
            # (server shutdown), every engine request of the session is aborted.
            self.lifecycle.step(Cause.STOPPED)
            reader.cancel()
            await self._actions.aclose()
            await asyncio.gather(reader, return_exceptions=True)
        return self.lifecycle.abort

    def stop(self, failure: SwitchboardError) -> None:
        """End the session as failed with `failure` (its running actions are aborted)."""
        self.lifecycle.fail(failure)
        self._wake()

    def _wake(self) -> None:
        if not self.lifecycle.starts_actions:
            self._over.set()

    async def _read(self, messages: AsyncIterable[service_pb.SessionMessage], drain: bool) -> None:
        try:
            async for message in messages:
                self._start(self.lifecycle.receive(message))
                if not self.lifecycle.takes_messages:
                    break
            else:
                self.lifecycle.step(Cause.INPUT_ENDED if drain else Cause.CLIENT_LEFT)
        except Exception as exc:  # a frame that does not decode; a bug of ours
            self.lifecycle.fail(client_error(exc))
        self._idle()

    def _start(self, ready: list[Ready[GeneratePlan]]) -> None:
        if not self.lifecycle.starts_actions:
            return
        for action in ready:
            self._actions.spawn(self._run(action), on_done=self._idle)

    def _idle(self) -> None:
        if not len(self._actions):
            self.lifecycle.step(Cause.IDLE)
        self._wake()

    # -- one action ------------------------------------------------------------------

    async def _run(self, ready: Ready[GeneratePlan]) -> None:
        record = self._record() if ready.plan.output_ids else None
        if record is None:
            await self._run_recorded(ready, None)
            return
        try:
            with logging_as(record.request_id):
                await self._run_recorded(ready, record)
        except asyncio.CancelledError:  # the session ended meanwhile
            record.cancelled = True
            raise
        finally:
            assert self._telemetry is not None
            self._telemetry.close(record)

    def _record(self) -> RequestRecord | None:
        if self._telemetry is None or self._caller is None:
            return None
        return self._telemetry.open_call(self._caller, name="GENERATE", api="evergreen")

    async def _run_recorded(self, ready: Ready[GeneratePlan], record: RequestRecord | None) -> None:
        plan = ready.plan
        ticket: Ticket | None = None
        try:
            session = self.lifecycle.session
            leaves = session.leaves(plan.input_ids[0])
            if plan.output_ids:
                inline = b"".join(p for leaf in leaves for p in leaf.parts if isinstance(p, bytes))
                ticket = self._admission.admit(
                    ProtocolName.EVERGREEN,
                    tokens=text_tokens_bound(inline),
                    record=record,
                    principal=self._principal,
                )
            files = {ref: await self._read_file(ref) for ref in inputs.file_refs(leaves)}
            chunks = inputs.join(leaves, files, session.limits.max_bytes)
            engine = self._engine
            # Tokenizing (a chat template over up to max_bytes of text) is CPU-bound for
            # as long as the input is large: off the loop, in the prompt thread, where
            # every prompt is built (the tokenizer is not entered from two threads).
            ids, sampling = await in_prompt_thread(
                lambda: prompt_token_ids(plan, chunks, engine.tokenizer, engine.info)
            )
            if not self.lifecycle.starts_actions:
                return  # the session failed while the prompt was built: nothing starts
            if record is not None:
                record.built_now()
            if ticket is not None:
                request = GenerationRequest(
                    request_id=f"evg-{uuid.uuid4().hex}",
                    prompt_token_ids=ids,
                    sampling=sampling,
                    lora_name=plan.lora_name,
                )
                await self._generate(request, plan.output_ids[0], ticket)
            self._start(self.lifecycle.finish(ready.index))
        except Exception as exc:
            error = client_error(exc)
            if record is not None:
                record.failed(error)
            self.lifecycle.fail(error)
            self._wake()
        finally:
            if ticket is not None:
                ticket.release()

    async def _generate(self, request: GenerationRequest, node_id: str, ticket: Ticket) -> None:
        stream = generate(self._engine, request, ticket)
        record = ticket.record
        try:
            async for event in stream:
                if record is not None:
                    record.count_event(event)
                if event.finish_reason == "abort":
                    raise Aborted("the engine aborted the generation")
                final = event.finish_reason is not None
                data = event.text.encode()
                if data or final:
                    session = self.lifecycle.session
                    fragment = session.emit(node_id, data, final, OUTPUT_METADATA)
                    await self._send(service_pb.SessionMessage(node_fragments=[fragment]))
            if record is not None:
                record.last_token_now()
        finally:
            await stream.aclose()

    async def _read_file(self, ref: FileRef) -> bytes:
        root = self._file_root
        assert root is not None  # the session refuses file refs without a root
        limit = self.lifecycle.session.limits.max_bytes
        return await asyncio.to_thread(read_file, root, ref, limit)


def read_file(root: Path, ref: FileRef, limit: int) -> bytes:
    """The file a ref names, if it is a regular file inside `root` once every symlink is
    followed, and at most `limit` bytes. Blocking: run it in a worker thread."""
    base = root.resolve(strict=True)
    try:
        path = (base / ref.relative_path).resolve(strict=True)
    except (FileNotFoundError, RuntimeError) as exc:
        raise InvalidRequest(f"file ref {ref.relative_path!r}: no such file") from exc
    except OSError as exc:  # a file where a directory should be, a name too long, ...
        raise InvalidRequest(f"file ref {ref.relative_path!r}: {exc.strerror}") from exc
    if not path.is_relative_to(base):
        raise InvalidRequest(f"file ref {ref.relative_path!r} leads outside the file root")
    if not path.is_file():
        raise InvalidRequest(f"file ref {ref.relative_path!r} is not a regular file")
    try:
        if path.stat().st_size > limit:
            raise ResourceExhausted(f"file ref {ref.relative_path!r} is larger than {limit} bytes")
        return path.read_bytes()
    except OSError as exc:  # unreadable: the client named it, the server is fine
        raise InvalidRequest(f"file ref {ref.relative_path!r}: {exc.strerror}") from exc
