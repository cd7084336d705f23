"""Fuzz the native gRPC services on the live server (real vLLM): every `salience.v1.Salience`
RPC and `evergreen.v2.EvergreenService/StartSession`.

The calls go through generic `unary_unary` / `unary_stream` / `stream_stream` callables
with no (de)serializers, so what the corpus writes reaches the server as bytes, unparsed
by the client. Half of each service's corpus is malformed bytes (a valid request's wire
format mutated field by field, cut short, bit-flipped or replaced: `binary_input`), the
other half valid protos with bad values (`bad_values`: scalar fields set to the edges of
their types, hostile strings, huge repeated fields, empty or unknown ids).

The verdict for every call:

- Salience: the call ends OK with a response (or, for Generate, events ending with one
  Done) that decodes as the RPC's response type, or with a status the proto's header names
  for a client fault (NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ABORTED,
  INVALID_ARGUMENT) and a message that says something (no exception text). Each input runs
  on a session of its own, and a sentinel `CloseSession` of it must then succeed (the
  server still serves that session); sessions the fuzzed call opened or forked are closed.
- Evergreen: each input is one session, its first message fuzzed, then a sentinel message
  that can never decode: the call must end with an `ABORT` message (a Struct `{code,
  message}`) then the status of that code, a client fault (as on the websocket: never
  UNKNOWN, INTERNAL or DATA_LOSS).

After the corpus, a valid Generate and a valid Evergreen session still complete, `/health`
answers and vLLM's own scheduler holds no request (`verdict`).
"""

from __future__ import annotations

import math
import random
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests import grpc_bytes
from tests.conftest import LiveServer
from tests.fuzz.corpus import DEFAULT_INPUTS, Offence, binary_input, rng
from tests.fuzz.evergreen import SEEDS as EVERGREEN_SEEDS
from tests.fuzz.evergreen import evergreen_abort
from tests.fuzz.harness import run_corpus, verdict

pytestmark = pytest.mark.e2e

SALIENCE = pb.DESCRIPTOR.services_by_name["Salience"].full_name
START_SESSION = "/evergreen.v2.EvergreenService/StartSession"
# The client faults salience.proto's header names ("Errors use gRPC status codes").
SALIENCE_CODES = {
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INVALID_ARGUMENT,
}
# Evergreen's spec names no codes, only that a failed action or a broken rule aborts the
# session: any status but OK and the server's own failures.
SERVER_FAULTS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS}
EVERGREEN_CODES = set(grpc.StatusCode) - SERVER_FAULTS - {grpc.StatusCode.OK}
RESPONSES: dict[str, type[Message]] = {
    "OpenSession": pb.OpenSessionResponse,
    "CloseSession": pb.CloseSessionResponse,
    "ForkSession": pb.ForkSessionResponse,
    "GetReadoutManifest": pb.ReadoutManifest,
    "DumpSession": pb.DumpSessionResponse,
}
TIMEOUT_S = 60  # per call: a fuzzed Generate decodes at most the tiny model's context


# -- valid protos with bad values -----------------------------------------------------------

PNG_HEAD = b"\x89PNG\r\n\x1a\n"
BAD_SCALARS: dict[int, tuple[Any, ...]] = {
    FieldDescriptor.CPPTYPE_UINT32: (0, 1, 1023, 1024, 1025, 2**16, 2**31, 2**32 - 1),
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), -1, 2**31 - 1, 2**15),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**63, 2**64 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), -1, 2**63 - 1),
    FieldDescriptor.CPPTYPE_FLOAT: (math.nan, math.inf, -math.inf, -0.0, -1.0, 3e38, 1e-45),
    FieldDescriptor.CPPTYPE_DOUBLE: (math.nan, math.inf, -math.inf, -1.0, 1e308, 5e-324),
    FieldDescriptor.CPPTYPE_BOOL: (True, False),
    FieldDescriptor.CPPTYPE_ENUM: (0, 1, 99, -1, 2**31 - 1),
}
BAD_STRINGS = ("", "\x00", "a\x00b", "\u202e\ufeff", "x" * 100_000, "\u00e9" * 20_000, "s-0")
BAD_BYTES = (b"", b"\x00", PNG_HEAD, PNG_HEAD + b"\xff" * 64, b"x" * 100_000)
# What one "many" mutation may add: a repeated field extended with copies of an item
# that already holds thousands reached 2 GB (10,000 inputs weighed 22 GB and the run
# ran out of memory). Three mutations stay within 72 MiB, past the server's 64 MiB bound.
MAX_EXTEND_BYTES = 24 * 1024 * 1024


def _copies(wanted: int, size: int) -> int:
    """How many copies of a `size`-byte item a "many" mutation adds, out of `wanted`."""
    return max(1, min(wanted, MAX_EXTEND_BYTES // max(1, size)))


def _bad_scalar(field: FieldDescriptor, r: random.Random) -> Any:
    if field.type == FieldDescriptor.TYPE_STRING:
        return r.choice(BAD_STRINGS)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return r.choice(BAD_BYTES)
    return r.choice(BAD_SCALARS[field.cpp_type])


def _mutate_message(message: Message, r: random.Random, depth: int = 0) -> None:
    """Set one field of `message` (or of a message inside it) to a bad value."""
    fields: list[FieldDescriptor] = [*message.DESCRIPTOR.fields]
    if not fields:
        return
    field = r.choice(fields)
    value = getattr(message, field.name)
    is_message = field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE
    if field.is_repeated:
        op = r.choice(("clear", "many", "one", "one"))
        if op == "clear":
            message.ClearField(field.name)
        elif is_message:
            if op == "many" or depth >= 3:
                template = value[0] if len(value) else value.add()
                value.extend([template] * _copies(r.choice((2, 100, 5_000)), template.ByteSize()))
            else:
                item = value[r.randrange(len(value))] if len(value) else value.add()
                _mutate_message(item, r, depth + 1)
        elif op == "many":
            item = _bad_scalar(field, r)
            size = len(item) if isinstance(item, str | bytes) else 8
            value.extend([item] * _copies(r.choice((2, 1_000, 20_000)), size))
        else:
            value.append(_bad_scalar(field, r))
    elif is_message:
        if depth < 3 and value.DESCRIPTOR.full_name != "google.protobuf.Any":
            _mutate_message(value, r, depth + 1)
        else:
            message.ClearField(field.name)
    else:
        setattr(message, field.name, _bad_scalar(field, r))


def bad_values(seed: Message, r: random.Random) -> bytes:
    """`seed` (left untouched) with one to three fields set to bad values, serialized: a
    valid proto of its type whose values no well-formed request holds."""
    message = type(seed)()
    message.CopyFrom(seed)
    for _ in range(r.randint(1, 3)):
        _mutate_message(message, r)
    data: bytes = message.SerializeToString()
    return data


# -- the corpus ----------------------------------------------------------------------------


def salience_seeds(session: str) -> list[tuple[str, Message]]:
    """(method, a valid request) on `session`."""
    generate = pb.GenerateRequest(session_id=session, append_tokens=[1, 2, 3], max_tokens=4)
    rich = pb.GenerateRequest()
    rich.CopyFrom(generate)
    rich.max_tokens = 3
    rich.logprobs_ranges.add(start=0, end=3)
    rich.logprob_top_k = 2
    rich.readout_ranges.add(start=1, end=3)
    rich.temperature, rich.top_p, rich.top_k = 0.5, 0.9, 1
    rich.stop_token_ids.append(5)
    imaged = pb.GenerateRequest()
    imaged.CopyFrom(generate)
    imaged.images.add(bytes=PNG_HEAD + b"\x00" * 16, mime="image/png", pad_range_end=2)
    return [
        ("Generate", generate),
        ("Generate", rich),
        ("Generate", imaged),
        ("OpenSession", pb.OpenSessionRequest(model="tiny")),
        ("CloseSession", pb.CloseSessionRequest(session_id=session)),
        ("ForkSession", pb.ForkSessionRequest(session_id=session, at_position=0)),
        ("GetReadoutManifest", pb.GetReadoutManifestRequest()),
        ("DumpSession", pb.DumpSessionRequest(session_id=session)),
    ]


def salience_input(index: int, session: str) -> tuple[str, bytes]:
    """(method, request bytes) of input `index` on `session`: odd inputs malformed bytes,
    even ones valid protos with bad values."""
    r = rng("grpc-salience", index)
    method, seed = r.choice(salience_seeds(session))
    if index % 2:
        return method, binary_input(seed.SerializeToString(), r)
    return method, bad_values(seed, r)


def evergreen_input(index: int) -> bytes:
    """The first message of session `index`: odd inputs malformed, even ones bad values."""
    r = rng("grpc-evergreen", index)
    seed = r.choice(EVERGREEN_SEEDS)
    if index % 2:
        return binary_input(seed.SerializeToString(), r)
    return bad_values(seed, r)


# -- one call each -------------------------------------------------------------------------


def _plain(details: str | None) -> str | None:
    """Why a status message is not a clear one for a client, or None."""
    if not details or not details.strip():
        return "an empty status message"
    tells = ("Traceback", "Exception calling application", "ExecuteBatchError", " object at 0x")
    if any(tell in details for tell in tells):
        return f"exception text in the status message: {details[:300]!r}"
    return None


def _status(error: grpc.aio.AioRpcError, allowed: set[grpc.StatusCode]) -> str | None:
    if error.code() not in allowed:
        return f"status {error.code().name}: {(error.details() or '')[:300]!r}"
    return _plain(error.details())


async def salience_call(
    channel: grpc.aio.Channel, method: str, data: bytes
) -> tuple[Any, str | None]:
    """(the response or events, why they left Salience's shape or None)."""
    path = f"/{SALIENCE}/{method}"
    try:
        if method == "Generate":
            call = grpc_bytes.unary_stream(channel, path)(data, timeout=TIMEOUT_S)
            events = [pb.GenerateEvent.FromString(raw) async for raw in call]
            kinds = [event.WhichOneof("event") for event in events]
            if not kinds or kinds[-1] != "done" or "done" in kinds[:-1] or None in kinds:
                return events, f"a Generate that ended OK with events {kinds[-5:]}"
            return events, None
        raw = await grpc_bytes.unary_unary(channel, path)(data, timeout=TIMEOUT_S)
        return RESPONSES[method].FromString(raw), None
    except grpc.aio.AioRpcError as error:
        return error, _status(error, SALIENCE_CODES)
    except DecodeError as exc:
        return None, f"a response that is not a {method} response: {exc}"


async def salience_probe(channel: grpc.aio.Channel, stub: Any, index: int) -> Offence | None:
    opened = await stub.OpenSession(pb.OpenSessionRequest(model="tiny"), timeout=TIMEOUT_S)
    session = opened.session_id
    method, data = salience_input(index, session)
    answer, reason = await salience_call(channel, method, data)
    opened_here = isinstance(answer, pb.OpenSessionResponse | pb.ForkSessionResponse)
    if opened_here and answer.session_id != session:
        await stub.CloseSession(pb.CloseSessionRequest(session_id=answer.session_id))
    if reason is None:
        try:
            await stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=30)
        except grpc.aio.AioRpcError as error:
            reason = f"the sentinel CloseSession ended {error.code().name}: {error.details()}"
    return None if reason is None else Offence(index, (method, data), (reason, answer))


async def evergreen_session(channel: grpc.aio.Channel, first: bytes) -> tuple[Any, str | None]:
    """(the messages received, why the session did not end in Evergreen's shape or None)."""
    call = grpc_bytes.stream_stream(channel, START_SESSION)(timeout=TIMEOUT_S)
    try:
        await call.write(first)
        await call.write(b"\xff")  # never a SessionMessage: the session must abort
        await call.done_writing()
    except (grpc.aio.AioRpcError, grpc.aio.UsageError):
        pass  # the first message already ended the call: its ending is read below
    received: list[service_pb.SessionMessage] = []
    try:
        async for raw in call:
            received.append(service_pb.SessionMessage.FromString(raw))
    except DecodeError as exc:
        return received, f"a message that is not a SessionMessage: {exc}"
    except grpc.aio.AioRpcError:
        pass
    code = await call.code()
    details = await call.details()
    abort = evergreen_abort(received[-1]) if received else None
    if abort is None:
        return received[-3:], f"status {code.name} {details!r} without an ABORT message last"
    if code not in EVERGREEN_CODES:
        return abort, f"status {code.name}: {details[:300]!r}"
    if abort[0] != code.name:
        return abort, f"ABORT {abort[0]} but status {code.name}"
    return abort, _plain(details) or _plain(abort[1])


# -- the tests -----------------------------------------------------------------------------


async def _still_serves(live: Any) -> None:
    """A valid Generate and a valid Evergreen session complete after the corpus."""
    async with grpc.aio.insecure_channel(live.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        opened = await stub.OpenSession(pb.OpenSessionRequest(model=live.model), timeout=30)
        request = pb.GenerateRequest(
            session_id=opened.session_id, append_tokens=[5, 6, 7], max_tokens=4
        )
        events = [e async for e in stub.Generate(request, timeout=60)]
        assert events[-1].done.completion_tokens == 4, events[-1]
        await stub.CloseSession(pb.CloseSessionRequest(session_id=opened.session_id))
        session = evergreen_grpc.EvergreenServiceStub(channel).StartSession(
            iter([EVERGREEN_SEEDS[0]]), timeout=60
        )
        replies = [m async for m in session]
        assert replies and not any(m.actions for m in replies), replies[-1:]
        assert await session.code() == grpc.StatusCode.OK


async def test_salience_grpc_corpus(live_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        offences = await run_corpus(lambda index: salience_probe(channel, stub, index))
    await _still_serves(live_server)
    verdict(live_server, "Salience over gRPC", offences)


async def test_evergreen_grpc_corpus(live_server: LiveServer) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:

        async def probe(index: int) -> Offence | None:
            first = evergreen_input(index)
            answer, reason = await evergreen_session(channel, first)
            return None if reason is None else Offence(index, first, (reason, answer))

        offences = await run_corpus(probe)
    await _still_serves(live_server)
    verdict(live_server, "Evergreen over gRPC", offences)


def test_corpus_is_seeded_and_covers_every_rpc() -> None:
    assert salience_input(4, "s-1") == salience_input(4, "s-1")
    assert evergreen_input(5) == evergreen_input(5)
    methods = {salience_input(i, "s-1")[0] for i in range(DEFAULT_INPUTS)}
    assert methods == set(RESPONSES) | {"Generate"}
    # The even inputs are valid protos of their type; the odd ones mostly are not.
    for i in range(0, 40, 2):
        method, data = salience_input(i, "s-1")
        request = {"Generate": pb.GenerateRequest}.get(method) or type(
            dict(salience_seeds("s-1"))[method]
        )
        request.FromString(data)
        service_pb.SessionMessage.FromString(evergreen_input(i))
