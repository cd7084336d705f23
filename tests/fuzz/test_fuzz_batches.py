"""Fuzz the batch APIs on the live server (real vLLM): input files (seeded mutations of a
valid JSONL file, line by line and as bytes), `POST /v1/batches` bodies and Message
Batches bodies.

An input file is uploaded and a batch made of it, run to its end: the upload must be a
`File` or an OpenAI error; the batch must end (`completed` or `failed`, never stay
running) with, if it completed, exactly one line per request across its output and error
files, each a JSON object naming a request of the file once; if it failed, `errors` in
OpenAI's `BatchError` shape with one of the documented codes. Bodies must be answered
with the route's object or the API's error body (4xx or 503), never anything else. And,
as every corpus, the server must be left healthy with nothing in the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.fuzz.corpus import Offence, dump, garbage_text, mutate_bytes, mutate_json, rng
from tests.fuzz.harness import (
    JsonRoutes,
    judge_status,
    openai_error_shape,
    post_corpus,
    run_corpus,
    verdict,
)
from tests.fuzz.test_fuzz_anthropic import error_shape as anthropic_error_shape

pytestmark = pytest.mark.e2e

MODEL = "tiny"
FILES = 48  # input files: each runs a batch to its end
BATCH_END_S = 60.0
CODES = {
    "invalid_json_line",
    "invalid_request",
    "url_mismatch",
    "duplicate_custom_id",
    "too_many_tasks",
    "empty_file",
    "invalid_file",
}
CHAT = "/v1/chat/completions"
LINES: list[dict[str, Any]] = [
    {
        "custom_id": "a",
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    },
    {
        "custom_id": "b",
        "method": "POST",
        "url": CHAT,
        "body": {
            "model": MODEL,
            "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
            "max_tokens": 1,
            "temperature": 0.5,
            "logprobs": True,
            "top_logprobs": 2,
        },
    },
    {
        "custom_id": "c",
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "z"}], "max_tokens": 2,
                 "response_format": {"type": "json_object"}},
    },
]  # fmt: skip


def input_file(index: int) -> bytes:
    """Input `index`: the valid file, its lines mutated one by one, or its bytes mangled."""
    r = rng("batch-files", index)
    lines = [dict(line) for line in LINES]
    roll = r.random()
    if roll < 0.1:
        return "\n".join(json.dumps(line) for line in lines).encode()
    if roll < 0.75:
        out = []
        for line in lines:
            mutated = mutate_json(line, r) if r.random() < 0.5 else line
            out.append(dump(mutated).encode())
        if r.random() < 0.2:
            extra = [b"", b"   ", b"{", b"[]", b"null", garbage_text(dump(lines[0]), r)]
            out.append(r.choice(extra))
        return b"\n".join(out)
    whole = "\n".join(json.dumps(line) for line in lines).encode()
    return mutate_bytes(whole, r)


def _requests_of(content: bytes) -> set[str]:
    """The custom_ids a valid file's lines name."""
    ids = set()
    for raw in content.split(b"\n"):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
            ids.add(line["custom_id"])
    return ids


async def _batch_ended(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + BATCH_END_S
    while True:
        batch: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
        if batch["status"] in ("completed", "failed"):
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"still {batch['status']} after {BATCH_END_S:.0f} s")
        await asyncio.sleep(0.25)


async def _lines(client: httpx.AsyncClient, file_id: str | None) -> list[Any]:
    if file_id is None:
        return []
    text = (await client.get(f"/v1/files/{file_id}/content")).content
    return [json.loads(line) for line in text.split(b"\n") if line]


async def _judge_file(client: httpx.AsyncClient, content: bytes) -> str | None:
    """Why the batch of this file left its shape, or None."""
    upload = await client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    )
    if upload.status_code != 200:
        return judge_status(upload, lambda: None, openai_error_shape)
    created = await client.post(
        "/v1/batches",
        json={"input_file_id": upload.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
    )
    if created.status_code != 200:
        return f"the batch was refused: {created.status_code} {created.text[:200]}"
    batch = await _batch_ended(client, created.json()["id"])
    if batch["status"] == "failed":
        errors = (batch.get("errors") or {}).get("data") or []
        if not errors or any(e.get("code") not in CODES for e in errors):
            return f"failed without documented errors: {errors}"
        return None
    lines = await _lines(client, batch["output_file_id"])
    lines += await _lines(client, batch["error_file_id"])
    ids = [line.get("custom_id") for line in lines]
    if len(ids) != len(set(ids)) or len(ids) != batch["request_counts"]["total"]:
        return f"{len(ids)} lines for {batch['request_counts']['total']} requests: {ids}"
    if not set(ids) <= _requests_of(content):
        return f"lines for requests the file does not hold: {ids}"
    return None


async def test_input_files(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=60) as client:

        async def probe(index: int) -> Offence | None:
            content = input_file(index)
            try:
                reason = await _judge_file(client, content)
            except httpx.TransportError as exc:
                reason = f"transport error: {exc!r}"
            return None if reason is None else Offence(index, content[:300], reason)

        offences = await run_corpus(probe, FILES)
    verdict(live_server, "batch input files", offences, FILES)


BODIES = JsonRoutes(
    "batches",
    {
        "/v1/batches": [
            {"input_file_id": "file-nope", "endpoint": CHAT, "completion_window": "24h",
             "metadata": {"k": "v"}},
            {"input_file_id": "file-x", "endpoint": "/v1/responses", "completion_window": "1h",
             "output_expires_after": {"anchor": "created_at", "seconds": 3600}},
        ],
        "/v1/messages/batches": [
            {"requests": [{"custom_id": "a", "params": {
                "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]
            }}]},
            {"requests": [{"custom_id": "a-1", "params": {"model": MODEL, "max_tokens": 1,
                                                          "messages": []}},
                          {"custom_id": "b_2", "params": {}}]},
        ],
    },
    {"/v1/batches": 50, "/v1/messages/batches": 50},
)  # fmt: skip


def _success(route: str, response: httpx.Response) -> str | None:
    body = response.json()
    kind = "batch" if route == "/v1/batches" else "message_batch"
    field = "object" if route == "/v1/batches" else "type"
    return None if isinstance(body, dict) and body.get(field) == kind else "not a batch"


def judge(route: str, response: httpx.Response) -> str | None:
    if route == "/v1/batches":
        return judge_status(response, lambda: _success(route, response), openai_error_shape)
    return judge_status(response, lambda: _success(route, response), anthropic_error_shape)


async def test_batch_bodies(live_server: LiveServer) -> None:
    offences = await post_corpus(live_server, BODIES, judge)
    # Message batches made here run in the background: wait for them to end before the
    # verdict counts what the engine holds.
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=60) as client:
        deadline = time.monotonic() + BATCH_END_S
        while True:
            page = (await client.get("/v1/messages/batches", params={"limit": 1000})).json()
            if all(b["processing_status"] == "ended" for b in page["data"]):
                break
            assert time.monotonic() < deadline, "message batches still running"
            await asyncio.sleep(0.25)
    verdict(live_server, "batch bodies", offences)
