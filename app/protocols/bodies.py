"""JSON bodies, parsed and checked: orjson + pydantic, failing as `InvalidRequest` with the
field named. One parser, one behaviour for every body, whoever reads it: an HTTP route
(`app.routes.http.bodies.read_body`), a websocket's frame, a batch's request (orjson
refuses lone surrogates and non-finite numbers; the stdlib's json accepts them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from app.errors import InvalidRequest

M = TypeVar("M", bound=BaseModel)
_UNSEEN = object()


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
