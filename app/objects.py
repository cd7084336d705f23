"""The app's objects: what the server builds once and closes once, built and closed here
and nowhere else.

`AppObjects(settings)` (made by `app.main.create_app`) builds what needs no engine:

- `keyring` (`app.auth`: keys to principals), `admission` (the one queue bound),
  `drain` (SIGTERM's sequence over it), `telemetry` (`app.telemetry`: each request's
  record, span, access-log line and metrics), `body_worker` (`app.routes.body_worker`:
  big bodies parsed in child processes, each started with its first), `body_pace`
  (`app.routes.body_pace`: the pace big bodies are taken in at).

`build_on(engine)` then builds what runs on the engine, in order, each from the
settings and the ones before it (`start_engine()` starts the process's engine from the
settings first, and owns it):

- `named_requests`: the engine requests their clients named (SMG's and llm-d's aborts);
- `conversations`: the Conversations API on its store (`--responses-store`);
- `batches`: the batch APIs on their store (`--batch-store`) and this replica's batch
  runner (started by the lifespan: `Batches.start`), which answers Responses requests
  through `responses`;
- `responses`: the Responses API on the responses' store, its background runs (their
  leases on the batches' store), and the conversations they continue;
- `salience`: Salience's runner on its session store (`--salience-store`), one for every
  connection of every transport: sessions outlive connections.

Building opens nothing: no file is created, no socket connected, no thread or task
started until a request needs it (each store opens itself on first use), so an app costs
nothing it does not use, starts the same with a store that cannot be reached (the calls
that need it fail, each on its own), and a test builds one for free; what needs the
engine is absent until it is built (a dependency that asks for it fails). `close()`
closes them once, in the reverse order of building: the Responses API's background runs
end (their last records written) before the stores they write close; then the
telemetry's last spans go out, and an engine these objects started stops last.

`app.main.create_app` makes them, builds them at once on an engine it is given (tests
drive such an app with or without its lifespan; `switchboard serve` starts its engine
first), or in the lifespan once it has started the engine; the lifespan closes them.
They are `app.state.objects`; routes take them from `app.routes.deps`; the gRPC server
is handed them.

Adding an object is one line, after what it uses: in `__init__` if it needs no engine,
in `build_on` if it does; `self.thing = self._closing(Thing(...))` when it has an
`async close()`, `self.thing = Thing(...)` when it has nothing to close. Then a
dependency in `app.routes.deps` for the routes that take it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Protocol, TypeVar

from app.admission import Admission
from app.auth import Keyring
from app.batches.service import Batches
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.routes.body_pace import BodyPace
from app.routes.body_worker import BodyWorker
from app.sessions.conversations import Conversations
from app.sessions.named import NamedRequests
from app.sessions.responses import Responses
from app.sessions.salience import SalienceRunner
from app.store import open_conversations, open_store
from app.telemetry.reports import Telemetry
from app.telemetry.tracing import Tracing


class Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class AppObjects:
    # Built once the engine is there (`build_on`).
    engine: Engine
    named_requests: NamedRequests
    conversations: Conversations
    batches: Batches
    responses: Responses
    salience: SalienceRunner

    def __init__(self, settings: Settings, tracing: Tracing | None = None) -> None:
        self._closing_stack = AsyncExitStack()
        self._stop_engine: Callable[[], None] | None = None
        self.settings = settings
        self.keyring = Keyring.from_settings(settings)
        self.admission = Admission(
            settings.max_queued_requests or None, settings.max_queued_tokens or None
        )
        self.drain = Drain(self.admission, settings.drain_timeout_s, settings.drain_grace_s)
        self.telemetry = Telemetry(settings, tracing)
        self.body_worker = self._closing(BodyWorker())
        self.body_pace = BodyPace(settings.big_body_bytes_per_s)

    def build_on(self, engine: Engine) -> None:
        """What runs on `engine`, built once."""
        settings, admission, drain = self.settings, self.admission, self.drain
        self.engine = engine
        admission.max_unit_tokens = engine.info.max_model_len
        self.named_requests = NamedRequests(engine)
        where = settings.responses_store_location()
        ttl_s, max_bytes = settings.responses_store_ttl_s, settings.responses_store_max_bytes
        record_bytes = settings.responses_store_max_record_bytes
        self.conversations = self._closing(
            Conversations(
                open_conversations(
                    where, ttl_s=ttl_s, max_bytes=max_bytes, max_record_bytes=record_bytes
                )
            )
        )
        self.batches = self._closing(
            Batches.from_settings(
                settings,
                engine,
                admission,
                drain,
                lambda: self.responses,
                self.keyring.tenants,
                self.telemetry,
            )
        )
        self.responses = self._closing(
            Responses(
                engine,
                admission,
                open_store(where, ttl_s=ttl_s, max_bytes=max_bytes, max_record_bytes=record_bytes),
                drain,
                self.conversations,
                self.telemetry,
                leases=self.batches.store,
                lease_s=settings.batch_lease_s,
            )
        )
        self.salience = self._closing(
            SalienceRunner.from_settings(engine, admission, drain, settings)
        )

    async def start_engine(self) -> None:
        """The process's engine started from the settings, and what runs on it built; the
        engine stops when these objects close (or at once, if building on it fails)."""
        from app.engine.vllm.startup import start_engine

        engine = await start_engine(self.settings, self.telemetry.tracing)
        try:
            self.build_on(engine)
        except BaseException:
            engine.shutdown()
            raise
        self._stop_engine = engine.shutdown

    def _closing(self, made: C) -> C:
        self._closing_stack.push_async_callback(made.close)
        return made

    async def close(self) -> None:
        try:
            await self._closing_stack.aclose()
        finally:
            self.telemetry.shutdown()
            if self._stop_engine is not None:
                self._stop_engine()
