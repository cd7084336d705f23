"""What a GraphPipe body may cost to decode: at most its own size, whatever its offsets
share (flatbuffers lets many offsets point at one string or table), with every count
bounded before anything is built for it; and the decoding, the config's constraint and
the tokenizing all happen off the event loop. Bodies are built by hand with flatbuffers'
Builder, as a hostile client would write them."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import AsyncIterator, Callable

import httpx
import numpy as np
import pytest

from app.config import Settings
from app.engine.constraints import Constraint
from app.errors import InvalidRequest, PayloadTooLarge
from app.main import create_app
from app.protocols.graphpipe import decode
from app.protocols.graphpipe.decode import (
    MAX_STRINGS,
    MAX_TENSORS,
    InferCall,
    MetadataCall,
    decode_request,
)
from app.protocols.graphpipe.reader import Buffer
from tests.fake_engine import FakeEngine, FakeTokenizer
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.graphpipe_hostile import shared_name, shared_string, shared_tensor

LIMIT = 64 << 20


def many_strings(count: int) -> bytes:
    """A String tensor of `count` one-byte prompts, none shared."""
    prompts = np.empty(count, dtype=object)
    prompts[:] = [b"a"] * count
    return infer_request(Infer([prompts]))


def peak_of(work: Callable[[], object]) -> tuple[BaseException | None, int]:
    """What `work()` raised (or None), and the peak of memory it allocated."""
    tracemalloc.start()
    try:
        work()
        raised = None
    except (InvalidRequest, PayloadTooLarge) as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return raised, peak


def test_a_string_shared_by_every_offset_is_counted_once_per_offset() -> None:
    body = shared_string(4096, 64 * 1024)  # 256 MiB decoded on the server before
    raised, peak = peak_of(lambda: decode_request(body, max_bytes=LIMIT))
    assert isinstance(raised, PayloadTooLarge)
    assert f"decodes to more than its own {len(body)} bytes" in raised.message
    assert "string_val" in raised.message
    assert peak < 4 * len(body)


def test_a_request_without_shared_strings_always_fits_its_budget() -> None:
    prompts = np.empty(3, dtype=object)
    prompts[:] = [b"", b"a", b"b" * 10_000]
    body = infer_request(Infer([prompts], input_names=["prompt"], output_names=["text"]))
    call = decode_request(body, max_bytes=LIMIT)
    assert isinstance(call, decode.InferCall)
    assert list(call.inputs[0]) == [b"", b"a", b"b" * 10_000]
    # Short strings shared a few times decode to less than the body: still decoded.
    assert isinstance(decode_request(shared_string(2, 16), max_bytes=LIMIT), decode.InferCall)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda: shared_tensor(1_000_000), f"1000000 elements is over the limit of {MAX_TENSORS}"),
        (lambda: shared_name(1_000_000), f"1000000 elements is over the limit of {MAX_TENSORS}"),
        (lambda: many_strings(MAX_STRINGS + 1), f"is over the limit of {MAX_STRINGS}"),
    ],
)
def test_counts_are_bounded_before_anything_is_built(
    body: Callable[[], bytes], message: str
) -> None:
    buffer = body()
    raised, peak = peak_of(lambda: decode_request(buffer, max_bytes=LIMIT))
    assert isinstance(raised, InvalidRequest)
    assert message in raised.message
    assert peak < len(buffer)


class LoopWatchingEngine(FakeEngine):
    """Records the thread every constraint check and every encode ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        inner = self.info.check_constraint
        assert inner is not None

        def check(constraint: Constraint) -> None:
            self.threads.append(threading.current_thread().name)
            inner(constraint)

        object.__setattr__(self.info, "check_constraint", check)
        self._tokenizer = WatchedTokenizer(self.threads)


class WatchedTokenizer(FakeTokenizer):
    """The fake tokenizer, recording the thread every encode ran in into `threads`."""

    def __init__(self, threads: list[str]) -> None:
        self.threads = threads

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, LoopWatchingEngine]]:
    engine = LoopWatchingEngine()
    app = create_app(Settings(model="fake"), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c, engine
    await app.state.objects.body_worker.close()  # its child, started by a big body


async def test_over_http_a_shared_string_is_a_413_infer_response(
    client: tuple[httpx.AsyncClient, LoopWatchingEngine],
) -> None:
    http, engine = client
    response = await http.post("/graphpipe", content=shared_string(4096, 64 * 1024))
    assert response.status_code == 413
    [(code, text)] = read_infer_response(response.content).errors
    assert code == 413 and "decodes to more than its own" in text
    assert engine.requests == []


async def test_decoding_the_constraint_and_tokenizing_run_off_the_event_loop(
    client: tuple[httpx.AsyncClient, LoopWatchingEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, engine = client
    loop_thread = threading.current_thread().name
    decoded_in: list[str] = []

    def watched_decode(buf: Buffer, *, max_bytes: int) -> InferCall | MetadataCall:
        decoded_in.append(threading.current_thread().name)
        return decode_request(buf, max_bytes=max_bytes)

    monkeypatch.setattr("app.protocols.graphpipe.decode.decode_request", watched_decode)
    prompts = np.empty(2, dtype=object)
    prompts[:] = [b"ab", b"cd"]
    config = '{"max_tokens": 2, "constraint": {"regex": "[a-z]+"}}'
    response = await http.post("/graphpipe", content=infer_request(Infer([prompts], config=config)))
    assert response.status_code == 200, read_infer_response(response.content).errors
    assert decoded_in and loop_thread not in decoded_in
    # The constraint is checked once by the core (the engine's own check is the fake's).
    assert engine.threads and loop_thread not in engine.threads
