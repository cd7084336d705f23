"""Shared fixtures: the tiny models, and ONE live server with real vLLM for the session.

Two CPU engines alive at once slow each other badly (ENGINE-NOTES), so the whole suite
shares one: `live_server` runs uvicorn with `create_app(settings)` (whose lifespan starts
the vLLM engine) on its own event loop in a background thread. Tests talk to it over
real sockets; engine-level tests run coroutines on the server's loop with `.call()`.
The image tests need a vision-language model: `vl_server` is a second server, started
only when one of them runs; the text server then sits idle beside it.

Both live servers also run the native gRPC server, on a free port of their own
(`LiveServer.grpc_target`). Every other app a test builds has gRPC off: the environment
sets `SWITCHBOARD_GRPC_PORT=0` for the session, so concurrent test runs never contend for
the default port, and `SWITCHBOARD_DRAIN_GRACE_S=0`, so that a drain ends with its work.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from hypothesis import settings as hypothesis_settings

if TYPE_CHECKING:  # app modules load lazily here; see the fixtures
    from tests.aborts import Workload

ROOT = Path(__file__).resolve().parent.parent
# No deadline on any property test's example: Hypothesis' default (200 ms) is a timed
# assertion, and under the suite's load one example of pure logic took 763 ms (a loaded
# machine, not a slow path) and failed the run.
hypothesis_settings.register_profile("switchboard", deadline=None)
hypothesis_settings.load_profile("switchboard")
CACHE = Path(os.environ.get("SWITCHBOARD_TEST_CACHE", ROOT / ".cache"))
os.environ["SWITCHBOARD_GRPC_PORT"] = "0"  # tests that serve gRPC pass a port
# A drain returns once its work is done, not after a router's probe interval: the tests
# of the grace period (the fleet's replicas: tests/fleet_setup.py) set one.
os.environ["SWITCHBOARD_DRAIN_GRACE_S"] = "0"
# Traced servers (the tests' receiver: tests/otlp_receiver.py) export every 100 ms, not
# every 5 s: a test waits for a span a fraction of a second.
os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
# Stored responses go to a file of this run, not to the user's state directory.
os.environ["SWITCHBOARD_RESPONSES_STORE"] = str(
    Path(tempfile.mkdtemp(prefix="switchboard-tests-")) / "responses.sqlite3"
)
T = TypeVar("T")


def tiny_model_path(context: int = 1024) -> Path:
    """The tiny model under .cache/, built on first use (seconds, no download), and
    rebuilt when its chat template has changed since (a stale cache would test the old
    template). `context`: its position limit (the same weights at any: rope)."""
    from app.tiny_model import CHAT_TEMPLATE, build_tiny_model

    model = CACHE / ("tiny-model" if context == 1024 else f"tiny-model-{context}")
    template = model / "chat_template.jinja"  # where transformers saves it
    if (
        not (model / "config.json").is_file()
        or not template.is_file()
        or template.read_text() != CHAT_TEMPLATE
    ):
        build_tiny_model(model, max_position_embeddings=context)
    return model


def tiny_vl_model_path() -> Path:
    """The tiny vision-language model under .cache/, built on first use."""
    from app.tiny_vl_model import build_tiny_vl_model

    model = CACHE / "tiny-vl-model"
    if not (model / "config.json").is_file():
        build_tiny_vl_model(model)
    return model


def tiny_lora_path(name: str = "tiny-lora", seed: int = 1) -> Path:
    from app.tiny_model import build_tiny_lora

    lora = CACHE / name
    if not (lora / "adapter_config.json").is_file():
        build_tiny_lora(tiny_model_path(), lora, seed=seed)
    return lora


def concepts_path() -> Path:
    """Random concept directions for the tiny model (Salience readouts)."""
    from app.engine.concepts import make_random_concepts

    path = CACHE / "tiny-concepts.safetensors"
    if not path.is_file():
        make_random_concepts(tiny_model_path(), path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_lora_dir() -> Path:
    return tiny_lora_path()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server for the tests of stores that replicas share (each test
    flushes what it uses first)."""
    from tests.redis_server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(autouse=True)
def _sockets_ended() -> Iterator[None]:
    """Fail a test that leaves a `tests.asgi_wire.Wire`'s app running: the app's handler
    would be closed by the garbage collector in a later test, outside any event loop
    (the suite's PytestUnraisableExceptionWarning of issue 30)."""
    from tests.asgi_wire import left_running

    yield
    left = left_running()
    for wire in left:
        wire.task.cancel()  # ended on the loop, by the next test that runs one
    assert not left, f"the test left {len(left)} socket(s) open: disconnect each Wire"


def free_port() -> int:
    """A port as the fleet's members take theirs (app/fleet/ports.py): a live server binds
    its ports only once its engine has started, tens of seconds after they are chosen, and
    meanwhile no outgoing connection nor the other lane may take them."""
    from app.fleet.ports import free_port as below_ephemeral

    return below_ephemeral()


# Every engine the suite starts spins 20 ms after its last step, not vLLM's second
# (`--engine-spin-ms`): the suite keeps both cores busy, and each engine's spin after every
# call took them from the other lane's tests (tests/engine/test_cpu_host.py).
ENGINE_SPIN_MS = 20


@dataclass
class LiveServer:
    base_url: str
    ws_url: str
    model: str
    lora: str
    loop: asyncio.AbstractEventLoop
    app: Any
    grpc_target: str  # host:port of the gRPC server

    @property
    def engine(self) -> Any:
        return self.app.state.objects.engine

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        """Run `coro` on the server's event loop (where the engine lives)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def running_requests(self) -> int:
        async def count() -> int:
            return int(self.engine.num_running_requests())

        return self.call(count())

    def engine_requests(self) -> int:
        """vLLM's own count of the requests it holds (running or waiting)."""
        return int(self.engine.engine_requests())

    @contextmanager
    def another_app(self, settings: Any, start_s: float = 60) -> Iterator[Any]:
        """`create_app(settings)` on this server's engine, served by uvicorn on its loop
        (the port and gRPC port `settings` name), for tests that need settings of their
        own (a key, a queue bound, session limits, a replica's store); yields the app."""
        import uvicorn

        from app.cli import uvicorn_config
        from app.main import create_app

        app = create_app(settings, engine=self.engine)
        server = uvicorn.Server(uvicorn_config(app, settings))
        serving = asyncio.run_coroutine_threadsafe(server.serve(), self.loop)
        deadline = time.monotonic() + start_s
        while not server.started:
            assert not serving.done(), f"the other app failed: {serving.exception()!r}"
            assert time.monotonic() < deadline, f"the other app did not start in {start_s} s"
            time.sleep(0.05)
        try:
            yield app
        finally:
            server.should_exit = True
            serving.result(timeout=start_s)

    def wait_idle(self, timeout: float = 10) -> int:
        """Poll until neither our wrapper nor vLLM itself holds a request; return the
        larger count last seen."""
        deadline = time.monotonic() + timeout
        count = max(self.running_requests(), self.engine_requests())
        while count and time.monotonic() < deadline:
            time.sleep(0.05)
            count = max(self.running_requests(), self.engine_requests())
        return count


LIVE_MODEL = "tiny"
LIVE_LORA = "tiny-lora"
VL_MODEL = "tiny-vl"


@contextmanager
def serve(settings: Any, model: str, lora: str = "") -> Iterator[LiveServer]:
    """uvicorn with `create_app(settings)` on its own loop in a background thread."""
    import uvicorn

    from app.cli import uvicorn_config
    from app.main import create_app

    grpc_port, port = free_port(), free_port()
    settings = settings.model_copy(
        update={"grpc_port": grpc_port, "port": port, "host": "127.0.0.1", "log_level": "warning"}
    )
    app = create_app(settings)
    server = uvicorn.Server(uvicorn_config(app, settings))
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
            _finish_tasks(loop)
        except BaseException as exc:  # surfaced to the waiting fixture below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"live-server-{model}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    while not server.started:
        if failure or not thread.is_alive():
            raise RuntimeError(f"live server failed to start: {failure!r}")
        if time.monotonic() > deadline:
            raise TimeoutError("live server did not start in 600 s")
        time.sleep(0.2)
    live = LiveServer(
        base_url=f"http://127.0.0.1:{port}",
        ws_url=f"ws://127.0.0.1:{port}",
        model=model,
        lora=lora,
        loop=loop,
        app=app,
        grpc_target=f"127.0.0.1:{grpc_port}",
    )
    _warm_up(live)
    try:
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the server left running and let it finish on `loop`, as `asyncio.run`
    ends. A handler still suspended when `serve()` returns (seen: a Salience socket's, at
    `pump.frames()`) would otherwise be closed by the garbage collector, in a later test
    and with no loop to run its clean-up on (a `PytestUnraisableExceptionWarning`)."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    from vllm.config import StructuredOutputsConfig

    from app.config import Settings
    from tests.otlp_receiver import session_receiver

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    settings = Settings(
        model=str(tiny_model_path()),
        served_model_name=LIVE_MODEL,
        # JSON, so that tests read the access log's fields (tests/e2e/test_traces.py).
        access_log="json",
        lora_modules=[f"{LIVE_LORA}={tiny_lora_path()}"],
        # Runtime loading (off by default), from the cache where the tests build adapters.
        allow_runtime_lora_updating=True,
        lora_root=CACHE,
        readout_concepts=concepts_path(),
        # Off by default; on here so that the pinning stays tested (tests/engine/
        # test_cpu_host.py) and the suite keeps the geometry it was timed on.
        pin_frontend=True,
        engine_spin_ms=ENGINE_SPIN_MS,
        # The tiny model's template writes hermes-style calls.
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        engine_args={
            "dtype": "float32",
            "max_model_len": 1024,
            "enable_lora": True,
            "max_loras": 2,
            "max_lora_rank": 8,
            # `--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace":
            # true}'`: a random model left free to write whitespace inside JSON rarely
            # stops, so constrained tests would end at max_tokens.
            "structured_outputs_config": StructuredOutputsConfig(
                backend="xgrammar", disable_any_whitespace=True
            ),
            # Traced, to the suite's receiver: every test's request is, and
            # tests/e2e/test_traces.py reads the spans (ours and vLLM's own).
            "otlp_traces_endpoint": session_receiver().endpoint,
        },
    )
    with serve(settings, LIVE_MODEL, LIVE_LORA) as live:
        yield live


@pytest.fixture(scope="session")
def vl_server() -> Iterator[LiveServer]:
    """A second live server, on the tiny vision-language model, for the image tests only
    (started by the first test that asks for it). Eager: compiling buys nothing for a
    handful of short requests and costs start time."""
    from app.config import Settings

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    settings = Settings(
        model=str(tiny_vl_model_path()),
        served_model_name=VL_MODEL,
        engine_spin_ms=ENGINE_SPIN_MS,
        render_process=False,  # no big prompt here: vLLM's import again for nothing
        engine_args={"dtype": "float32", "max_model_len": 512, "enforce_eager": True},
    )
    with serve(settings, VL_MODEL) as live:
        yield live


@pytest.fixture(scope="session")
def abort_workload(live_server: LiveServer) -> Workload:
    """The long workload every abort test aborts, measured once (tests/aborts.py)."""
    from tests.aborts import measure_workload

    return live_server.call(measure_workload(live_server.engine), timeout=600)


def _warm_up(live: LiveServer) -> None:
    """The first request on a fresh CPU engine takes ~20 s; pay it here, not in a test."""
    import httpx

    body = {"model": live.model, "prompt": "warm up", "max_tokens": 2}
    response = httpx.post(f"{live.base_url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()


SECOND_ENGINES = ("vl_server", "long_server")


def _is_fleet(item: pytest.Item) -> bool:
    return item.path.parent.name == "fleet"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on a second engine (the image server, the agent CLIs' long-context server)
    run after every other test, in their own order: vLLM's Prometheus gauges belong to
    the process, and a second engine started in it takes them over from the live
    server, whose /metrics tests read them (`vllm:lora_requests_info` went missing once
    the agent tests, first in collection order, had run). The fleet's tests run last of
    all, in the order of `tests.fleet_setup.MODULES` (the drain, then the restarts, come
    after everything that needs its replicas as they started)."""
    from tests.fleet_setup import MODULES

    def order(item: pytest.Item) -> tuple[bool, int, bool]:
        fleet = _is_fleet(item)
        return (
            fleet,
            MODULES.index(item.path.stem) if fleet else 0,
            any(f in SECOND_ENGINES for f in getattr(item, "fixturenames", ())),
        )

    items.sort(key=order)
    if any(_is_fleet(item) for item in items):
        first_unit = next((i for i in items if i.path.parent.name == "unit"), None)
        first_fleet = next(i for i in items if _is_fleet(i))
        (first_unit or first_fleet).stash[_LAUNCH_FLEET] = True


_LAUNCH_FLEET = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The fleet's replicas start in the background as the unit tests begin (see
    tests/fleet_setup.py), when the fleet's tests are to run."""
    if item.stash.get(_LAUNCH_FLEET, False):
        from tests.fleet_setup import launch

        launch()


def pytest_sessionfinish() -> None:
    from tests.fleet_setup import stop
    from tests.otlp_receiver import stop_session

    stop()
    stop_session()
