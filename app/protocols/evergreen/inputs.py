"""An action's input, flattened and read: the chunks a GENERATE prompt is made of. Sans-IO.

`Session.leaves` gives a complete input tree's leaves, whose payloads are bytes or
`FileRef`s. The transport reads the files (`file_refs` says which, each once), off the
event loop, and `join` puts the chunks together. The session's one byte budget,
`Limits.max_bytes`, bounds what an input flattens to with its files read: the leaves
check the inline bytes as they are walked, `join` the total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.errors import ResourceExhausted
from app.protocols.evergreen.generate import Chunk
from app.protocols.evergreen.refs import FileRef
from app.protocols.evergreen.session import Leaf


def file_refs(leaves: Sequence[Leaf]) -> list[FileRef]:
    """The files the leaves name, each once, in order."""
    refs = (part for leaf in leaves for part in leaf.parts if isinstance(part, FileRef))
    return list(dict.fromkeys(refs))


def join(leaves: Sequence[Leaf], files: Mapping[FileRef, bytes], max_bytes: int) -> list[Chunk]:
    """The chunks, each leaf's parts concatenated, `files` standing in for their refs."""
    out: list[Chunk] = []
    size = 0
    for leaf in leaves:
        parts = [files[part] if isinstance(part, FileRef) else part for part in leaf.parts]
        size += sum(map(len, parts))
        if size > max_bytes:
            raise ResourceExhausted(f"the input is larger than {max_bytes} bytes")
        out.append(Chunk(leaf.node_id, leaf.metadata, b"".join(parts)))
    return out
