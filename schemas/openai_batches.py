"""OpenAI's Files and Batch APIs as pydantic models: the body of `POST /v1/batches`
(documentation: the body is checked by `app.protocols.openai.batches.read_create`, so an
error names the field as OpenAI does) and the objects /openapi.json documents for the
answers (documentation only, open to extra keys as OpenAI's own are).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ExpiresAfter(BaseModel):
    anchor: Literal["created_at"]
    seconds: int


class BatchCreate(BaseModel):
    """POST /v1/batches."""

    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    completion_window: str  # "24h" (or any "<n>s", "<n>m", "<n>h" up to 168h)
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


class FileObject(_Open):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    status_details: str | None


class FileList(_Open):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(_Open):
    id: str
    object: Literal["file"]
    deleted: bool


class BatchError(_Open):
    code: str
    message: str
    line: int | None
    param: str | None


class BatchErrors(_Open):
    object: Literal["list"]
    data: list[BatchError]


class BatchRequestCounts(_Open):
    total: int
    completed: int
    failed: int


class Batch(_Open):
    id: str
    object: Literal["batch"]
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str | None
    completion_window: str
    status: Literal[
        "validating",
        "failed",
        "in_progress",
        "finalizing",
        "completed",
        "expired",
        "cancelling",
        "cancelled",
    ]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    usage: dict[str, object] | None
    metadata: dict[str, str] | None


class BatchList(_Open):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool
