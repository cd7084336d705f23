"""JSON request bodies: orjson + pydantic, failing as `InvalidRequest` with the field named.

Every route reads its JSON body through `read_body` instead of FastAPI's body parameters:
FastAPI's parameter solving costs about a millisecond per request under load (measured
with py-spy in bench/openai_vs_vllm.py runs), a direct `model_validate` a few
microseconds; and one parser means one behaviour (orjson refuses lone surrogates and
non-finite numbers; FastAPI's stdlib json accepts them). `json_body` declares such a body
in /openapi.json, so the docs show what FastAPI would have shown had it parsed it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.requests import Request

from app.errors import InvalidRequest

M = TypeVar("M", bound=BaseModel)
_UNSEEN = object()
_REF = "#/components/schemas/{model}"


def describe_errors(
    errors: Sequence[Mapping[str, Any]], *, sourced: bool = False, data: Any = _UNSEEN
) -> InvalidRequest:
    """One `InvalidRequest` for a list of pydantic/FastAPI validation errors: every
    problem in the message, the first offending field as `param`. FastAPI's errors
    (`sourced`) start each location with where the value came from ("body", "query",
    "path", ...), which is not part of the field's name.

    Given the `data` that failed, each location is read against it: pydantic writes the
    branch of a union it tried into the location (`content.str`, `content.list[...]`,
    a tagged union's tag), which is no field of the client's, so a step the data does not
    have is left out (but for the missing field a "missing" error names); and a union's
    branches that fail on the value's type alone are left out when another branch got
    further into the value (a list of blocks is not reported as "not a string")."""
    if not errors:
        return InvalidRequest("Invalid request")

    def where(error: Mapping[str, Any]) -> tuple[Any, ...]:
        loc = tuple(error.get("loc", ()))[1 if sourced else 0 :]
        return loc if data is _UNSEEN else _in_data(loc, data, error.get("type") == "missing")

    located = [(where(e), e) for e in errors]
    if data is not _UNSEEN:
        located = [
            (loc, e)
            for loc, e in located
            if not (
                str(e.get("type", "")).endswith("_type")
                and any(len(other) > len(loc) and other[: len(loc)] == loc for other, _ in located)
            )
        ] or located
    names = [(".".join(str(p) for p in loc), e["msg"]) for loc, e in located]
    message = "; ".join(f"{name or 'body'}: {msg}" for name, msg in names)
    return InvalidRequest(message, param=names[0][0] or None)


def _in_data(loc: tuple[Any, ...], data: Any, missing: bool) -> tuple[Any, ...]:
    """`loc` without the steps `data` does not have (pydantic's union branches), but for
    the missing field a `missing` error ends with."""
    kept: list[Any] = []
    node = data
    for i, step in enumerate(loc):
        has = (isinstance(node, dict) and isinstance(step, str) and step in node) or (
            isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)
        )
        if has:
            node = node[step]
        elif i < len(loc) - 1 or not missing:
            continue  # a union's branch or tag, not a field
        kept.append(step)
    return tuple(kept)


def parse_json(raw: bytes | str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The body is not valid JSON: {exc}") from exc


def validate(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe_errors(exc.errors(), data=data) from exc


async def read_body(request: Request, model: type[M]) -> M:
    return validate(model, parse_json(await request.body()))


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
