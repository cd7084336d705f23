"""JSON request bodies over HTTP: read, parsed and checked (`app.protocols.bodies`: orjson +
pydantic, failing as `InvalidRequest` with the field named), and declared in /openapi.json.

Every route reads its JSON body through `read_body` instead of FastAPI's body parameters:
FastAPI's parameter solving costs about a millisecond per request under load (measured
with py-spy in bench/openai_vs_vllm.py runs), a direct `model_validate` a few
microseconds; and one parser means one behaviour (orjson refuses lone surrogates and
non-finite numbers; FastAPI's stdlib json accepts them). `json_body` declares such a body
in /openapi.json, so the docs show what FastAPI would have shown had it parsed it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request

from app.protocols.bodies import parse_json, validate

M = TypeVar("M", bound=BaseModel)
_REF = "#/components/schemas/{model}"


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
