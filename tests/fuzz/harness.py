"""Running a corpus against the live server, and the verdict every fuzz test gives.

`run_corpus` sends every input of a protocol, a few at a time (a busy server is part of
what is tested), and collects the inputs whose answer left the protocol's shape. `verdict`
then also asks that the server still answers `/health`, that admission holds no ticket
and that the engine has no request left, and fails with the first offending inputs (seed
index, input, answer).

For HTTP protocols whose bodies are JSON, `JsonRoutes` is the whole corpus (seeds per
route, each route's weight) and `post_corpus` the whole run: a protocol module gives its
seeds and a `judge` of one answer (`judge_status`: a 200 to the success shape, an error
status to the API's error body; `openai_error_shape` is every OpenAI API's). `sse_events`
reads a stream, named events included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import websockets

from tests.fuzz.corpus import INPUTS, Offence, describe, json_input, rng

CONCURRENCY = 6
PROBE_TIMEOUT_S = 90

# One input: its seed index in, None if its answer had the shape, else what went wrong.
Probe = Callable[[int], Awaitable[Offence | None]]
# One websocket input: its seed index in, (the input sent, what went wrong or None) out.
SocketSession = Callable[[int], Awaitable[tuple[Any, str | None]]]


def socket_probe(session: SocketSession) -> Probe:
    """The probe of a websocket corpus: `session(index)` judges its input's answers; a
    connection that is refused, reset or not upgraded is the input's offence too."""

    async def probe(index: int) -> Offence | None:
        try:
            sent, reason = await session(index)
        except (OSError, websockets.WebSocketException) as exc:
            sent, reason = "(see the seed index)", f"connection failed: {exc!r}"
        return None if reason is None else Offence(index, sent, reason)

    return probe


async def run_corpus(probe: Probe, total: int = INPUTS) -> list[Offence]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int) -> Offence | None:
        async with gate:
            try:
                return await asyncio.wait_for(probe(index), timeout=PROBE_TIMEOUT_S)
            except Exception as exc:  # the harness must name the input, whatever happened
                return Offence(index, "(see the seed index)", f"probe failed: {exc!r}")

    results = await asyncio.gather(*(one(i) for i in range(total)))
    return [r for r in results if r is not None]


def verdict(live: Any, protocol: str, offences: list[Offence], total: int = INPUTS) -> None:
    """Fail with the first offending inputs, or if the server is not left healthy and idle."""
    problems = []
    health = httpx.get(f"{live.base_url}/health", timeout=30)
    if health.status_code != 200:
        problems.append(f"/health answers {health.status_code} {health.text[:200]!r}")
    left = live.wait_idle()
    if left:
        problems.append(f"{left} engine request(s) still running after the corpus")
    tickets = live.app.state.admission.in_flight
    if tickets:
        problems.append(f"{tickets} admission ticket(s) still held after the corpus")
    if offences or problems:
        raise AssertionError("\n".join([describe(offences, protocol, total), *problems]))


# -- HTTP protocols with JSON bodies ---------------------------------------------------------


@dataclass(frozen=True)
class JsonRoutes:
    """An HTTP protocol's corpus: valid JSON bodies per route (`seeds`), and how often each
    route is drawn (`weights`). Input `index` is (route, body): a seed of the route drawn,
    as is, mutated or garbage (`corpus.json_input`), from `rng(protocol, index)`."""

    protocol: str
    seeds: Mapping[str, Sequence[Any]]
    weights: Mapping[str, int]

    def make_input(self, index: int) -> tuple[str, bytes]:
        r = rng(self.protocol, index)
        route = r.choices(list(self.weights), weights=list(self.weights.values()))[0]
        return route, json_input(r.choice(self.seeds[route]), r)


# Why an answer to a POST of `route` left the protocol's shape, or None.
Judge = Callable[[str, httpx.Response], str | None]


async def post_corpus(
    live: Any, routes: JsonRoutes, judge: Judge, headers: Mapping[str, str] | None = None
) -> list[Offence]:
    """POST every input of `routes` to the live server; the answers `judge` refuses."""
    sent = {"content-type": "application/json", **(headers or {})}
    async with httpx.AsyncClient(base_url=live.base_url, timeout=60) as client:

        async def probe(index: int) -> Offence | None:
            route, body = routes.make_input(index)
            try:
                response = await client.post(route, content=body, headers=sent)
            except httpx.TransportError as exc:  # reset, closed, timed out
                return Offence(index, (route, body), f"transport error: {exc!r}")
            reason = judge(route, response)
            if reason is None:
                return None
            return Offence(index, (route, body), f"{reason}: {response.text[:300]!r}")

        return await run_corpus(probe)


def openai_error_shape(body: Any) -> str | None:
    """Why `body` is not an OpenAI error body (`{"error": {"message", "type", "param",
    "code"}}`), or None: the error shape of every OpenAI API (completions, chat,
    responses)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "not {'error': {...}}"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "error.message or error.type is not a string"
    if "param" not in error or "code" not in error:
        return "error.param or error.code missing"
    return None


def judge_status(
    response: httpx.Response,
    success: Callable[[], str | None],
    error_shape: Callable[[Any], str | None],
    error_statuses: Sequence[int] = (503,),
) -> str | None:
    """Why an answer left its API's shape, or None: a 200 is judged by `success`, a 4xx
    or one of `error_statuses` must be `error_shape`'s body, any other status is wrong."""
    status = response.status_code
    try:
        if status == 200:
            return success()
        if 400 <= status < 500 or status in error_statuses:
            reason = error_shape(response.json())
            return f"{status} {reason}" if reason else None
    except ValueError as exc:  # not JSON where JSON was due
        return f"{status}, body does not parse: {exc}"
    return f"status {status}"


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each event of a server-sent event stream; ValueError
    on a line that is no SSE field."""
    events: list[tuple[str | None, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if not line or line.startswith(":") or field in ("id", "retry"):
                continue
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
            else:
                raise ValueError(f"not a server-sent event line: {line[:100]!r}")
        if name is not None or data:
            events.append((name, "\n".join(data)))
    return events
