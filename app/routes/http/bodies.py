"""Request bodies over HTTP: read within a bound, JSON declared, parsed and checked
(`app.protocols.bodies`: orjson + pydantic within `MAX_JSON_VALUES`, failing as
`InvalidRequest` with the field named), and declared in /openapi.json.

Every route reads its body here, and nowhere else: `read_bytes` (GraphPipe's
flatbuffers) or `read_json` / `read_body` (every JSON API). Bounded before the work:

- bytes: a body over the route's limit (`--max-request-body-bytes`, GraphPipe's own
  `--graphpipe-max-request-bytes`) is `PayloadTooLarge` (413 in the API's shape) before
  any of it is read when its Content-Length says so, and as soon as the count passes the
  limit when it is chunked; nothing past the limit is ever held;
- parsed off the event loop when big: `parsed` hands every body to the body worker
  (`app.routes.body_worker`), whose rule puts one over `IN_CHILD_BYTES` in a child
  process (holding no lock the serving process needs), fairly per client (the peer's
  address);
- declared type: a JSON API's body must say `application/json` (or `application/*+json`;
  parameters such as charset allowed), else `UnsupportedMediaType` (415): a web page may
  POST `text/plain`, a form, or a body with no type to any server without the browser
  asking the server first (no CORS preflight), and it must not drive this one.

Every route reads its JSON body through `read_body` instead of FastAPI's body parameters:
FastAPI's parameter solving costs about a millisecond per request under load (measured
with py-spy in bench/openai_vs_vllm.py runs), a direct `model_validate` a few
microseconds; and one parser means one behaviour (orjson refuses lone surrogates and
non-finite numbers; FastAPI's stdlib json accepts them). `json_body` declares such a body
in /openapi.json, so the docs show what FastAPI would have shown had it parsed it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request

from app.errors import PayloadTooLarge, UnsupportedMediaType
from app.protocols.bodies import validate
from app.routes.body_pace import QUANTUM
from app.routes.body_worker import IN_CHILD_BYTES, Pieces, client_of
from app.routes.deps import get_objects

M = TypeVar("M", bound=BaseModel)
_REF = "#/components/schemas/{model}"


def body_limit(request: Request) -> int:
    """A JSON API's body limit: `--max-request-body-bytes`."""
    limit: int = request.app.state.settings.max_request_body_bytes
    return limit


def _too_large(size: int, limit: int, *, partial: bool = False) -> PayloadTooLarge:
    amount = f"at least {size}" if partial else f"{size}"
    return PayloadTooLarge(
        f"The request body of {amount} bytes is over this server's limit of {limit} bytes"
    )


async def read_bytes(request: Request, limit: int) -> Pieces:
    """The body as it was read (`Pieces`: joined only where a route needs it whole),
    refused (`PayloadTooLarge`) before more than `limit` bytes of it are read: at once
    when its Content-Length is over, else as soon as the count is. A big one is read at
    the server's pace (`app.routes.body_pace`), a quantum paid for before the next is
    read, in its client's turn."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    pace = get_objects(request.app).body_pace
    chunks: list[bytes] = []
    size = paid = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit, partial=True)
        if chunk:
            chunks.append(chunk)
        while size > IN_CHILD_BYTES and size - paid >= QUANTUM:
            await pace.take(_client(request), QUANTUM)
            paid += QUANTUM
    if size > IN_CHILD_BYTES:
        await pace.pay(_client(request), size - paid)
    return Pieces(tuple(chunks), size)


def check_json_type(request: Request) -> None:
    """`UnsupportedMediaType` unless the body is declared JSON (see the module
    docstring)."""
    declared = request.headers.get("content-type", "")
    kind = declared.partition(";")[0].strip().lower()
    main, _, sub = kind.partition("/")
    if main == "application" and (sub == "json" or sub.endswith("+json")):
        return
    got = repr(declared) if declared else "none"
    raise UnsupportedMediaType(
        f"This API takes JSON bodies: send Content-Type: application/json (got {got})"
    )


def _client(request: Request) -> Hashable:
    """Whose turn `request`'s body is taken and parsed in: its tenant's, else its peer's
    (the principal its route's key check put on the request, where it has one)."""
    peer = request.client.host if request.client is not None else None
    return client_of(getattr(request.state, "principal", None), peer)


async def parsed(request: Request, job: str, raw: Pieces, **arguments: Any) -> Any:
    """`raw`, a body read from `request`, parsed by the body worker's `job` (off the
    event loop when big) in its client's turn."""
    worker = get_objects(request.app).body_worker
    return await worker.parse(job, raw, client=_client(request), **arguments)


async def read_json(request: Request) -> Any:
    """A JSON API's body: declared JSON, within the body limit and `MAX_JSON_VALUES`,
    parsed (`parsed`)."""
    check_json_type(request)
    return await parsed(request, "json", await read_bytes(request, body_limit(request)))


async def read_body(request: Request, model: type[M]) -> M:
    return validate(model, await read_json(request))


def documented(*models: type[BaseModel]) -> dict[str, Any]:
    """A JSON schema for one of `models` that carries their definitions under `$defs`;
    `collect_definitions` moves those into the document's components, where the `$ref`s
    point. For what /openapi.json cannot learn from a handler's signature."""
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    refs = [{"$ref": _REF.format(model=m.__name__)} for m in models]
    schema: dict[str, Any] = refs[0] if len(refs) == 1 else {"anyOf": refs}
    return {**schema, "$defs": defs["$defs"]}


def json_body(*models: type[BaseModel]) -> dict[str, Any]:
    """The `openapi_extra` of a route that reads its JSON body by hand: the body FastAPI
    would have documented had it parsed one of `models` itself."""
    content = {"application/json": {"schema": documented(*models)}}
    return {"requestBody": {"required": True, "content": content}}


def collect_definitions(node: Any, components: dict[str, Any] | None = None) -> Any:
    """`node` (an OpenAPI document) with every `$defs` left by `documented` moved into
    `components.schemas`."""
    if components is None:
        components = node.setdefault("components", {}).setdefault("schemas", {})
    if isinstance(node, dict):
        for name, schema in node.pop("$defs", {}).items():
            if components.setdefault(name, schema) != schema:
                raise ValueError(f"two different schemas are both named {name}")
        for value in node.values():
            collect_definitions(value, components)
    elif isinstance(node, list):
        for value in node:
            collect_definitions(value, components)
    return node
