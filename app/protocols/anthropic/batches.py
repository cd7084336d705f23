"""Anthropic's Message Batches: the create body's requests, the `MessageBatch` object, the
results' lines.

- `RequestsReader`: the `requests` of `POST /v1/messages/batches`, read one at a time
  from the body's text (a body may be hundreds of megabytes: only one request is ever
  decoded at once), each checked as Anthropic checks it when the batch is created
  (`custom_id` of 1 to 64 letters, digits, `_` or `-`, unique; `params` an object); its
  params are checked when it runs, as `/v1/messages` alone would check them (an
  `errored` result, as Anthropic validates them).
- `batch_object`: a batch record and its tally as a `MessageBatch` (`processing_status`
  `in_progress`, `canceling` or `ended`; `request_counts` whose outcomes stay zero until
  it has ended, as Anthropic documents; `results_url` once it has ended).
- `answer_line`, `expired_line`, `cancelled_line`: one request's result line,
  `{"custom_id", "result": {"type": succeeded | errored | canceled | expired, ...}}`.

Sans-IO.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Generator, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from app.errors import InvalidRequest
from app.protocols.batches import CANCELLED, ERRORED, EXPIRED, SUCCEEDED, BatchRecord
from app.store.batches import Tally

ENDPOINT = "/v1/messages"
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of a double's range")
    return number


# The stdlib's decoder, as strict as orjson (every other body's parser): no NaN, no
# Infinity, no number past a double's range (lone surrogates and integers past 64 bits
# are refused when the request is kept: orjson writes neither).
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def _rfc3339(when: float | None) -> str | None:
    if when is None:
        return None
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")


class RequestsReader:
    """The `requests` of a create body (its text), one at a time: each a line
    `{"custom_id", "params"}` to keep; `InvalidRequest` for what Anthropic refuses at
    creation (the whole batch is refused)."""

    def __init__(self, text: str, max_requests: int) -> None:
        self.text = text
        self.max_requests = max_requests
        self.count = 0
        self.model: str | None = None

    def __iter__(self) -> Iterator[bytes]:
        text, at = self.text, self._skip(0)
        if not text.startswith("{", at):
            raise InvalidRequest("The body must be a JSON object")
        at = self._skip(at + 1)
        found = False
        while not text.startswith("}", at):
            key, at = self._decode(at, "the body")
            at = self._skip(at)
            if not isinstance(key, str) or not text.startswith(":", at):
                raise InvalidRequest("The body is not valid JSON")
            at = self._skip(at + 1)
            if key == "requests":
                found = True
                at = yield from self._requests(at)
            else:
                _, at = self._decode(at, key)
            at = self._skip(at)
            if text.startswith(",", at):
                at = self._skip(at + 1)
            elif not text.startswith("}", at):
                raise InvalidRequest("The body is not valid JSON")
        if self._skip(at + 1) != len(text):
            raise InvalidRequest("The body is not valid JSON")
        if not found:
            raise InvalidRequest("requests: Field required", param="requests")
        if self.count == 0:
            raise InvalidRequest("requests: at least one request is required", param="requests")

    def _requests(self, at: int) -> Generator[bytes, None, int]:
        text, seen = self.text, set[str]()
        if not text.startswith("[", at):
            raise InvalidRequest("requests: must be a list", param="requests")
        at = self._skip(at + 1)
        while not text.startswith("]", at):
            where = f"requests.{self.count}"
            request, at = self._decode(at, where)
            yield self._check(request, where, seen)
            at = self._skip(at)
            if text.startswith(",", at):
                at = self._skip(at + 1)
            elif not text.startswith("]", at):
                raise InvalidRequest(f"{where}: the list is not valid JSON", param=where)
        return at + 1

    def _check(self, request: Any, where: str, seen: set[str]) -> bytes:
        self.count += 1
        if self.count > self.max_requests:
            raise InvalidRequest(
                f"requests: at most {self.max_requests} requests in a batch", param="requests"
            )
        if not isinstance(request, dict):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        custom_id, params = request.get("custom_id"), request.get("params")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            raise InvalidRequest(
                f"{where}.custom_id: 1 to 64 letters, digits, '_' or '-'",
                param=f"{where}.custom_id",
            )
        if custom_id in seen:
            raise InvalidRequest(
                f"{where}.custom_id: {custom_id!r} is used by an earlier request",
                param=f"{where}.custom_id",
            )
        seen.add(custom_id)
        if not isinstance(params, dict):
            raise InvalidRequest(f"{where}.params: must be an object", param=f"{where}.params")
        if self.model is None and isinstance(params.get("model"), str):
            self.model = params["model"]
        try:
            return orjson.dumps({"custom_id": custom_id, "params": params})
        except orjson.JSONEncodeError as exc:  # what orjson refuses, as a route's body
            raise InvalidRequest(f"{where}.params: {exc}", param=f"{where}.params") from exc

    def _decode(self, at: int, where: str) -> tuple[Any, int]:
        try:
            return _DECODER.raw_decode(self.text, at)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequest(f"{where}: not valid JSON ({exc})") from exc

    def _skip(self, at: int) -> int:
        match = _WHITESPACE.match(self.text, at)
        return at if match is None else match.end()


def request_of(line: bytes) -> tuple[str, dict[str, Any]]:
    """A kept request's `custom_id` and params."""
    request = orjson.loads(line)
    return request["custom_id"], request["params"]


def processing_status(record: BatchRecord) -> str:
    if record.terminal:
        return "ended"
    return "canceling" if record.status == "cancelling" else "in_progress"


def batch_object(record: BatchRecord, tally: Tally, results_url: str) -> dict[str, Any]:
    ended = record.terminal
    ended_at = next((record.times[s] for s in ("completed", "expired", "cancelled", "failed")
                     if s in record.times), None)  # fmt: skip
    counts = {
        "processing": record.total,
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    if ended:
        counts = {
            "processing": 0,
            "succeeded": tally.count(SUCCEEDED),
            "errored": tally.count(ERRORED),
            "canceled": tally.count(CANCELLED),
            "expired": tally.count(EXPIRED),
        }
    return {
        "id": record.id,
        "type": "message_batch",
        "processing_status": processing_status(record),
        "request_counts": counts,
        "ended_at": _rfc3339(ended_at),
        "created_at": _rfc3339(record.created_at),
        "expires_at": _rfc3339(record.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _rfc3339(record.times.get("cancelling")),
        "results_url": results_url if ended else None,
    }


def answer_line(custom_id: str, status: int, body: Mapping[str, Any]) -> bytes:
    """A request's result: its message, or the error `/v1/messages` would have answered."""
    if status == 200:
        result: dict[str, Any] = {"type": "succeeded", "message": body}
    else:
        result = {"type": "errored", "error": body}
    return orjson.dumps({"custom_id": custom_id, "result": result})


def expired_line(custom_id: str) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "result": {"type": "expired"}})


def cancelled_line(custom_id: str) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "result": {"type": "canceled"}})
