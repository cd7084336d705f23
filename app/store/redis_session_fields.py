"""How a Salience session is written in Redis (`app.store.redis_sessions`): its hash's
fields and its tokens' bytes, both ways.

- The lifetime (`LIFETIME`: phase, last use, tokens charged and held, the claim and its
  lease, the tenant) is seven fields of `s:<id>`, every call's to read (a record with no
  `tenant`, written before tenants, is the default tenant's); the content but the tokens
  (images as references to `img:<digest>`, and while a Generate runs its undo: offset,
  images, tail) is three more, read only by calls on the session's content.
- Tokens are little-endian uint32, whatever the replica's byte order, so that a Generate
  appends to them (`APPEND`) without reading them.
- Numbers are written so that they read back exactly (`repr` of a float), an infinite
  lease as `inf`.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from app.engine.base import PromptImage
from app.protocols.salience.lifecycle import Phase
from app.protocols.salience.sessions import Session
from app.tenants import DEFAULT_TENANT

LIFETIME = ("phase", "used", "charged", "held", "claim", "lease", "tenant")
# An image block as the record holds it: start, end, the image's digest, its pad tokens.
ImageRef = list[Any]


def pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """HGETALL's flat list as a mapping."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def lifetime(session_id: str, values: Sequence[bytes | None]) -> Session:
    """A session with its lifetime only (no content), from the `LIFETIME` fields."""
    phase, used, charged, held, claim, lease, tenant = (v or b"" for v in values)
    return Session(
        session_id,
        tenant=tenant.decode() if values[-1] is not None else DEFAULT_TENANT,
        phase=Phase(phase.decode()),
        last_used=float(used or 0),
        charged=int(charged or 0),
        held=int(held or 0),
        claim=claim.decode(),
        lease=float(lease or "inf"),
    )


def lifetime_fields(session: Session) -> dict[str, bytes]:
    values = (
        session.phase.value.encode(),
        repr(session.last_used).encode(),
        str(session.charged).encode(),
        str(session.held).encode(),
        session.claim.encode(),
        repr(session.lease).encode() if math.isfinite(session.lease) else b"inf",
        session.tenant.encode(),
    )
    return dict(zip(LIFETIME, values, strict=True))


def refs(images: Sequence[PromptImage]) -> list[ImageRef]:
    return [[b.start, b.end, b.image.digest, b.image.pad_tokens] for b in images]


def content_fields(session: Session) -> dict[str, bytes]:
    """The content's fields but the tokens (`t:<id>`, written on their own)."""
    undo = session.undo
    return {
        "images": orjson.dumps(refs(session.images)),
        "undo": b"" if undo is None else orjson.dumps([undo.offset, refs(undo.images)]),
        "tail": b"" if undo is None else token_bytes(undo.tail),
    }


def tokens(data: bytes) -> array[int]:
    out = array("I")
    out.frombytes(data)
    if sys.byteorder == "big":
        out.byteswap()
    return out


def token_bytes(ids: array[int]) -> bytes:
    if sys.byteorder == "big":
        ids = array("I", ids)
        ids.byteswap()
    return ids.tobytes()
