"""OpenAI's Files and Batch APIs: the objects, the input file's lines, the output lines.

- `file_object`: a stored file as OpenAI's `File` object (`purpose` batch for an upload,
  batch_output for a batch's output and error files).
- `read_create`: the body of `POST /v1/batches`, checked (the endpoint one of
  `ENDPOINTS`, the completion window, `metadata`'s bounds, `output_expires_after`).
- `InputReader`: an input file's bytes, fed in parts as they come from the store, cut
  into lines; each line checked as OpenAI's validation step checks it (JSON, `custom_id`
  unique, `method` POST, `url` the batch's endpoint), its request kept whole; what is
  wrong is reported in `errors` as OpenAI's `BatchError`s (`code`, `line`, `message`,
  `param`): `invalid_json_line`, `invalid_request`, `url_mismatch`,
  `duplicate_custom_id`, `too_many_tasks`, `empty_file`. A request's body is checked
  when it runs, as the endpoint alone would check it (its error is its output line).
- `batch_object`: a batch record and its tally as OpenAI's `Batch` object.
- `answer_line`, `expired_line`, `cancelled_line`: one request's line of the output or
  the error file: `{"id", "custom_id", "response": {"status_code", "request_id",
  "body"}, "error"}`, or a request that never ran with `response` null and `error`
  `batch_expired` / `batch_cancelled`.

Sans-IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import orjson

from app.errors import InvalidRequest
from app.protocols.batches import (
    CANCELLED,
    CANCELLED_MESSAGE,
    ERRORED,
    EXPIRED,
    EXPIRED_MESSAGE,
    SUCCEEDED,
    BatchRecord,
    window_seconds,
)
from app.store.batches import Tally

# The endpoints a batch's requests may call.
Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
ENDPOINTS: tuple[Endpoint, ...] = get_args(Endpoint)
# The outcomes whose lines go to the output file, and to the error file.
OUTPUT_OUTCOMES = (SUCCEEDED,)
ERROR_OUTCOMES = (ERRORED, EXPIRED, CANCELLED)
_MIN_EXPIRY_S, _MAX_EXPIRY_S = 3600, 30 * 24 * 3600
_MAX_ERRORS = 100  # errors reported of one file (its first)


def file_object(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": doc["id"],
        "object": "file",
        "bytes": doc["bytes"],
        "created_at": int(doc["created_at"]),
        "expires_at": None if doc.get("expires_at") is None else int(doc["expires_at"]),
        "filename": doc["filename"],
        "purpose": doc["purpose"],
        "status": "processed",
        "status_details": None,
    }


def expires_after(value: Any, param: str) -> float | None:
    """An `expires_after` object's seconds (None: not given)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("anchor") != "created_at":
        raise InvalidRequest(f"{param}.anchor must be 'created_at'", param=f"{param}.anchor")
    seconds = value.get("seconds")
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)  # a multipart form's fields are strings
    if (
        not isinstance(seconds, int)
        or isinstance(seconds, bool)
        or not _MIN_EXPIRY_S <= seconds <= _MAX_EXPIRY_S
    ):
        raise InvalidRequest(
            f"{param}.seconds must be an integer from {_MIN_EXPIRY_S} to {_MAX_EXPIRY_S}",
            param=f"{param}.seconds",
        )
    return float(seconds)


def check_metadata(value: Any, param: str = "metadata") -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values 512."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > 16:
        raise InvalidRequest(f"{param} must be an object of at most 16 pairs", param=param)
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 64 or len(item) > 512:
            raise InvalidRequest(
                f"{param}: keys are strings of up to 64 characters, values up to 512",
                param=f"{param}.{key}",
            )
    return dict(value)


def read_create(body: Any) -> dict[str, Any]:
    """The checked fields of a `POST /v1/batches` body."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("The body must be a JSON object")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise InvalidRequest(f"{name} is required (a string)", param=name)
    if body["endpoint"] not in ENDPOINTS:
        raise InvalidRequest(
            f"Unsupported endpoint {body['endpoint']!r}: one of {', '.join(ENDPOINTS)}",
            param="endpoint",
        )
    window = body["completion_window"]
    output_s = expires_after(body.get("output_expires_after"), "output_expires_after")
    return {
        "input_file_id": body["input_file_id"],
        "endpoint": body["endpoint"],
        "window": window,
        "window_s": window_seconds(window),
        "metadata": check_metadata(body.get("metadata")),
        "output_expires_s": output_s,
    }


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "line": line, "param": param}


class InputReader:
    """An input file's lines, checked, from its bytes fed in parts."""

    def __init__(self, endpoint: str, max_requests: int) -> None:
        self.endpoint = endpoint
        self.max_requests = max_requests
        self.errors: list[dict[str, Any]] = []
        self.model: str | None = None
        self.count = 0  # requests read
        self._line = 0
        self._rest = b""
        self._ids: set[str] = set()

    def feed(self, data: bytes) -> list[bytes]:
        """The requests (their lines, whole) of the complete lines `data` ends."""
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        return [r for r in (self._read(line) for line in lines) if r is not None]

    def end(self) -> list[bytes]:
        """The last line's request; an empty file is an error."""
        last = self._read(self._rest)
        self._rest = b""
        if self.count == 0 and not self.errors:
            self._fail(_error("empty_file", "The input file contains no requests.", None))
        return [] if last is None else [last]

    def _fail(self, error: dict[str, Any]) -> None:
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append(error)

    def _read(self, raw: bytes) -> bytes | None:
        self._line += 1
        line = self._line
        if not raw.strip():
            return None
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self._fail(
                _error("invalid_json_line", "This line is not parseable as valid JSON.", line)
            )
            return None
        if not isinstance(request, dict):
            self._fail(_error("invalid_json_line", "This line is not a JSON object.", line))
            return None
        problem = _problem(request, self.endpoint)
        if problem is not None:
            self._fail(_error(*problem[:2], line, problem[2]))
            return None
        custom_id = request["custom_id"]
        if custom_id in self._ids:
            message = f"The custom_id {custom_id!r} is used by an earlier line."
            self._fail(_error("duplicate_custom_id", message, line, "custom_id"))
            return None
        self._ids.add(custom_id)
        self.count += 1
        if self.count > self.max_requests:
            if self.count == self.max_requests + 1:
                message = f"The input file holds more than {self.max_requests} requests."
                self._fail(_error("too_many_tasks", message, line))
            return None
        if self.model is None and isinstance(request["body"].get("model"), str):
            self.model = request["body"]["model"]
        return raw.strip()


def _problem(request: dict[str, Any], endpoint: str) -> tuple[str, str, str] | None:
    """What is wrong with a line's request: (code, message, param)."""
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "invalid_request", "custom_id must be a non-empty string.", "custom_id"
    if request.get("method") != "POST":
        return "invalid_request", "method must be 'POST'.", "method"
    if request.get("url") != endpoint:
        message = f"The url {request.get('url')!r} does not match the batch's endpoint {endpoint}."
        return "url_mismatch", message, "url"
    if not isinstance(request.get("body"), dict):
        return "invalid_request", "body must be a JSON object.", "body"
    return None


def request_of(line: bytes) -> tuple[str, dict[str, Any]]:
    """A checked line's `custom_id` and body."""
    request = orjson.loads(line)
    return request["custom_id"], request["body"]


def _line_id(record_id: str, index: int) -> str:
    return f"batch_req_{record_id.removeprefix('batch_')}_{index}"


def answer_line(
    record_id: str, index: int, custom_id: str, status: int, body: Mapping[str, Any]
) -> bytes:
    """A request's line with the answer the endpoint gave it (a body, or an error's)."""
    line_id = _line_id(record_id, index)
    response = {"status_code": status, "request_id": line_id.replace("batch_", "", 1), "body": body}
    return orjson.dumps(
        {"id": line_id, "custom_id": custom_id, "response": response, "error": None}
    )


def _unrun_line(record_id: str, index: int, custom_id: str, code: str, message: str) -> bytes:
    error = {"code": code, "message": message}
    return orjson.dumps(
        {"id": _line_id(record_id, index), "custom_id": custom_id, "response": None, "error": error}
    )


def expired_line(record_id: str, index: int, custom_id: str) -> bytes:
    return _unrun_line(record_id, index, custom_id, "batch_expired", EXPIRED_MESSAGE)


def cancelled_line(record_id: str, index: int, custom_id: str) -> bytes:
    return _unrun_line(record_id, index, custom_id, "batch_cancelled", CANCELLED_MESSAGE)


def batch_object(record: BatchRecord, tally: Tally) -> dict[str, Any]:
    errors = None
    if record.errors:
        errors = {"object": "list", "data": record.errors}
    usage = None
    if tally.count(SUCCEEDED):
        usage = {
            "input_tokens": tally.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tally.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tally.input_tokens + tally.output_tokens,
        }
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "model": record.model,
        "errors": errors,
        "input_file_id": record.input_file_id,
        "completion_window": record.window,
        "status": record.status,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": int(record.created_at),
        "in_progress_at": record.at("in_progress"),
        "expires_at": int(record.expires_at),
        "finalizing_at": record.at("finalizing"),
        "completed_at": record.at("completed"),
        "failed_at": record.at("failed"),
        "expired_at": record.at("expired"),
        "cancelling_at": record.at("cancelling"),
        "cancelled_at": record.at("cancelled"),
        "request_counts": {
            "total": record.total,
            "completed": tally.count(SUCCEEDED),
            "failed": tally.count(*ERROR_OUTCOMES),
        },
        "usage": usage,
        "metadata": record.metadata,
    }
