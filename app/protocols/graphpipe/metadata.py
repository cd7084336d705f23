"""GraphPipe's `MetadataResponse` as plain data, and its JSON form for `GET`.

The JSON keeps the spec's field names (`name`, `version`, `server`, `description`,
`inputs`, `outputs`; each IO with `name`, `description`, `shape`, `type`); `type` is the
spec's type name (`"Int64"`), so a reader of the spec can match it to the type table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.protocols.graphpipe.tensors import TensorType


@dataclass(frozen=True, slots=True)
class IOMetadata:
    name: str
    description: str
    shape: tuple[int, ...]  # -1: any size in that dimension
    type: TensorType


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    version: str
    server: str
    description: str
    inputs: tuple[IOMetadata, ...]
    outputs: tuple[IOMetadata, ...]

    def to_json(self) -> dict[str, Any]:
        def io(item: IOMetadata) -> dict[str, Any]:
            return {
                "name": item.name,
                "description": item.description,
                "shape": list(item.shape),
                "type": item.type.name,
            }

        return {
            "name": self.name,
            "version": self.version,
            "server": self.server,
            "description": self.description,
            "inputs": [io(i) for i in self.inputs],
            "outputs": [io(o) for o in self.outputs],
        }
