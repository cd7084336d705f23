"""The JSON side of GraphPipe's HTTP routes (`GET /graphpipe[/{model}]`), as pydantic
models: what /openapi.json documents. The POST routes carry flatbuffers (fbs/)."""

from __future__ import annotations

from pydantic import BaseModel


class GraphPipeIO(BaseModel):
    name: str
    description: str
    shape: list[int]
    type: str


class GraphPipeMetadata(BaseModel):
    """The `MetadataResponse` as JSON, plus how to call the POST route."""

    name: str
    version: str
    server: str
    description: str
    inputs: list[GraphPipeIO]
    outputs: list[GraphPipeIO]
    how_to_call: list[str]


class GraphPipeError(BaseModel):
    code: int
    message: str


class GraphPipeErrors(BaseModel):
    errors: list[GraphPipeError]
