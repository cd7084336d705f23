"""A batch in no API's shape: its record, its lifecycle, and the outcomes of its requests.

OpenAI's Batch API and Anthropic's Message Batches are one thing to the server: a list of
requests to one endpoint, answered in the background, each exactly once, before a
deadline, unless cancelled. `BatchRecord` is what the store keeps of one (the APIs
render it in their shapes: `app.protocols.openai.batches`,
`app.protocols.anthropic.batches`), its statuses OpenAI's.

The lifecycle, written once (every change of status goes through `advance`, which
refuses a move the table does not hold and stamps the new status's time):

    validating  -> in_progress | failed | expired | cancelling
    in_progress -> finalizing | expired | cancelling
    finalizing  -> completed
    cancelling  -> cancelled
    completed, failed, expired, cancelled: terminal

`finalizing` is the moment the last request has its result and the output is being
made; `expired`: the completion window passed first (the requests without a result get
one saying so); `cancelling`: a client's cancel, until the requests running stop (they
and those never started get a result saying so). Anthropic's `processing_status` reads
`in_progress` for the first three, `canceling`, and `ended` for the terminal ones.

Outcomes of a request (its result's kind): `succeeded`, `errored` (the answer the API
would have given the request alone, an error), `expired`, `cancelled`.

Sans-IO: no store, no clock (times are passed in), no framework.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import orjson

from app.errors import InvalidRequest

Status = Literal[
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
]
Api = Literal["openai", "anthropic"]

_MOVES: dict[str, tuple[str, ...]] = {
    "validating": ("in_progress", "failed", "expired", "cancelling"),
    "in_progress": ("finalizing", "expired", "cancelling"),
    "finalizing": ("completed",),
    "cancelling": ("cancelled",),
}
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
# Still running: a runner has work to do (validate, answer, end it).
ACTIVE = frozenset(_MOVES)

# What each outcome says in the output, and which file (OpenAI) it goes to.
SUCCEEDED, ERRORED, EXPIRED, CANCELLED = "succeeded", "errored", "expired", "cancelled"
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_MESSAGE = "This request was not executed because the batch was cancelled."

_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MAX_WINDOW_S = 7 * 24 * 3600


def window_seconds(window: str, param: str = "completion_window") -> int:
    """A completion window (`24h`, OpenAI's only one; any `<n>s`, `<n>m` or `<n>h` up to
    7 days is taken too) in seconds."""
    match = _WINDOW.match(window)
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)] if match else 0
    if not 0 < seconds <= MAX_WINDOW_S:
        raise InvalidRequest(
            f"Invalid completion_window {window!r}: use '24h' (or a duration such as '30m' "
            f"or '90s', up to {MAX_WINDOW_S // 3600}h)",
            param=param,
        )
    return seconds


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch as the store keeps it. Times are Unix seconds (None: not reached)."""

    id: str
    api: Api
    tenant: str
    endpoint: str  # the path every request is for: /v1/chat/completions, /v1/messages, ...
    created_at: float
    expires_at: float  # the completion window's end
    window: str
    status: Status = "validating"
    input_file_id: str | None = None
    total: int = 0  # requests, known once validated
    chunk_size: int = 1
    chunks: int = 0
    model: str | None = None
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None  # why validation failed
    output_expires_s: float = 30 * 24 * 3600  # how long its output files live
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, float] = field(default_factory=dict)  # <status> -> when it began

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def at(self, status: str) -> int | None:
        """When `status` began, in whole seconds (None: never)."""
        when = self.times.get(status)
        return None if when is None else int(when)

    def advance(self, status: Status, now: float, **changes: Any) -> BatchRecord:
        """This batch moved to `status` at `now` (with `changes`), if the lifecycle
        allows it; `ValueError` if it does not (a bug: callers check first)."""
        if status not in _MOVES.get(self.status, ()):
            raise ValueError(f"batch {self.id}: no move from {self.status} to {status}")
        return replace(self, status=status, times={**self.times, status: now}, **changes)

    def can(self, status: str) -> bool:
        return status in _MOVES.get(self.status, ())

    def expired(self, now: float) -> bool:
        """Its window has passed with requests unanswered (it is to end as expired)."""
        return now >= self.expires_at and self.status in ("validating", "in_progress")

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> BatchRecord:
        return cls(**orjson.loads(data))


def chunk_of(index: int, record: BatchRecord) -> int:
    return index // record.chunk_size


def chunk_range(chunk: int, record: BatchRecord) -> range:
    """The request indices of `chunk`."""
    start = chunk * record.chunk_size
    return range(start, min(start + record.chunk_size, record.total))
