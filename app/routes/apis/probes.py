"""Kubernetes' probes: `GET /health` (liveness) and `GET /ready` (readiness).

- `/health`: the process answers and the engine is alive. Stays 200 while draining, so a
  draining pod is not killed before its streams end.
- `/ready`: the engine is alive, the server is not draining and the admission queue is
  not at its bound: send it traffic. Otherwise 503 with an OpenAI error body (and a
  `Retry-After`), so a load balancer takes the pod out at once on SIGTERM.

Neither needs the API key (as `vllm serve`'s /health).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from app.errors import Overloaded
from app.routes.apis.openai import openai_error
from app.routes.deps import AdmissionDep, DrainDep, EngineDep
from app.routes.http.bodies import documented
from schemas.openai_replies import ErrorResponse

router = APIRouter()

_ERROR_BODY = {"application/json": {"schema": documented(ErrorResponse)}}
_NOT_READY: dict[int | str, dict[str, Any]] = {
    "4XX": {"description": "OpenAI error body (a wrong method)", "content": _ERROR_BODY},
    "5XX": {
        "description": "OpenAI error body: the engine is down (503), the server is draining "
        "or its queue is at the bound (503 with Retry-After)",
        "content": _ERROR_BODY,
    },
}


@router.get(
    "/health",
    response_class=Response,
    responses={200: {"description": "The engine is alive (empty body)"}, **_NOT_READY},
)
async def health(engine: EngineDep) -> Response:
    await engine.check_health()
    return Response(status_code=200)


@router.get(
    "/ready",
    response_class=Response,
    responses={200: {"description": "Ready for traffic (empty body)"}, **_NOT_READY},
)
async def ready(engine: EngineDep, admission: AdmissionDep, drain: DrainDep) -> Response:
    await engine.check_health()
    if drain.draining:
        return openai_error(Overloaded("The server is draining", retry_after_s=1))
    if admission.saturated():
        retry = admission.retry_after_s()
        return openai_error(Overloaded("The queue is at its bound", retry_after_s=retry))
    return Response(status_code=200)
