"""JSON bodies, parsed and checked: orjson + pydantic, failing as `InvalidRequest` with the
field named. One parser, one behaviour for every body, whoever reads it: an HTTP route
(`app.routes.http.bodies.read_body`), a websocket's frame, a batch's request (orjson
refuses lone surrogates and non-finite numbers; the stdlib's json accepts them).

A body holding more than `MAX_JSON_VALUES` JSON values is `PayloadTooLarge` before it is
parsed: what parsing costs is per value, not per byte (32 MiB of `[{},{},...]` made 11 M
dicts, 940 MiB and seconds of CPU), and orjson holds the GIL while it parses, so a
worker thread would stall the event loop just the same (measured). The count is taken at
C speed over the raw text (every `,`, `[` and `{`, those inside strings included, so it
errs on the side of counting more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from app.errors import InvalidRequest, PayloadTooLarge

M = TypeVar("M", bound=BaseModel)
Raw = bytes | bytearray | memoryview | str

# JSON values a body may hold (see the module docstring): a quarter of a million, far
# past any chat (a 200k-token conversation of code counts tens of thousands), a token-id
# prompt of 256k ids; parsed in well under a tenth of a second whatever they are.
MAX_JSON_VALUES = 1 << 18
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


def json_values_bound(raw: Raw) -> int:
    """An upper bound of the JSON values `raw` holds, counted without parsing it."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if isinstance(data, memoryview):
        data = bytes(data)
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def parse_json(raw: Raw) -> Any:
    """`raw` parsed, once its values are counted within `MAX_JSON_VALUES`."""
    values = json_values_bound(raw)
    if values > MAX_JSON_VALUES:
        raise PayloadTooLarge(
            f"The body holds up to {values} JSON values (counting every `,`, `[` and `{{`); "
            f"this server parses at most {MAX_JSON_VALUES}"
        )
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The body is not valid JSON: {exc}") from exc


def validate(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe_errors(exc.errors(), data=data) from exc
