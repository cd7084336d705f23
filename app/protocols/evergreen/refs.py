"""Evergreen chunk refs: which URIs a chunk may point at, checked when the chunk arrives.

Sans-IO. `parse_ref` turns a ref into what the session stores:

- `data:` URIs (RFC 2397: `data:[<mediatype>][;base64],<data>`) are decoded on the spot
  into bytes; their mediatype is ignored, the chunk's metadata says what the bytes are;
- `file://` URIs become a `FileRef`, a path relative to the configured file root. They
  are refused when no root is configured (the default) and when the path could leave the
  root lexically (`..`, NUL). Symlinks can only be judged on the file system: the reader
  (`app.sessions.evergreen`, in a worker thread) resolves the path and refuses one that
  lands outside the root;
- everything else is refused.

`file://path/to/x` and `file:///path/to/x` name the same file, `<root>/path/to/x`: the
spec's own examples put the path where a host would go, and a ref must not reach outside
the root either way.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, unquote_to_bytes

from app.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file under the configured root, by its path relative to that root."""

    relative_path: str


def parse_ref(uri: str, files_allowed: bool) -> bytes | FileRef:
    scheme, colon, rest = uri.partition(":")
    scheme = scheme.lower()
    if not colon:
        raise InvalidRequest(f"ref {uri[:80]!r} is not a URI; refs are data: or file:// URIs")
    if scheme == "data":
        return _decode_data(rest)
    if scheme == "file":
        if not files_allowed:
            raise InvalidRequest(
                "file:// refs are off on this server (set --evergreen-file-root); "
                "send the bytes inline or as a data: URI"
            )
        return _file_ref(uri, rest)
    raise InvalidRequest(f"ref scheme {scheme!r} is not supported; use data: or file://")


def _decode_data(rest: str) -> bytes:
    header, comma, payload = rest.partition(",")
    if not comma:
        raise InvalidRequest("a data: URI needs a ',' before its data")
    if header.lower().endswith(";base64"):
        try:
            return base64.b64decode(unquote(payload), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(f"a data: URI has bad base64: {exc}") from exc
    return unquote_to_bytes(payload)


def _file_ref(uri: str, rest: str) -> FileRef:
    if not rest.startswith("//"):
        raise InvalidRequest(f"ref {uri[:80]!r}: a file URI starts with file://")
    raw = rest[2:]
    if "?" in raw or "#" in raw:
        raise InvalidRequest(f"ref {uri[:80]!r}: a file URI takes no query or fragment")
    path = unquote(raw)
    parts = PurePosixPath(path).parts
    if "\x00" in path or ".." in parts:
        raise InvalidRequest(f"ref {uri[:80]!r} would leave the file root")
    relative = [part for part in parts if part not in ("/", ".")]
    if not relative:
        raise InvalidRequest(f"ref {uri[:80]!r} names no file")
    return FileRef("/".join(relative))
