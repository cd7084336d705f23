"""Anthropic's Message Batches as pydantic models: the create body (documentation: it is
read request by request by `app.protocols.anthropic.batches.RequestsReader`, each
request's params checked when it runs, as Anthropic does) and the objects /openapi.json
documents for the answers (documentation only).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class MessageBatchRequest(BaseModel):
    custom_id: str  # 1 to 64 of [a-zA-Z0-9_-], unique in the batch
    params: dict[str, Any]  # a /v1/messages body (not streamed)


class MessageBatchCreate(BaseModel):
    """POST /v1/messages/batches."""

    requests: list[MessageBatchRequest]


class MessageBatchRequestCounts(_Open):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(_Open):
    id: str
    type: Literal["message_batch"]
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts
    ended_at: str | None
    created_at: str
    expires_at: str
    archived_at: str | None
    cancel_initiated_at: str | None
    results_url: str | None


class MessageBatchList(_Open):
    data: list[MessageBatch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class MessageBatchDeleted(_Open):
    id: str
    type: Literal["message_batch_deleted"]
