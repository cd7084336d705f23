"""The GraphPipe core: flatbuffer <-> numpy codec, validation, and the language model as
GraphPipe sees it. Sans-IO: bytes and engine events in, bytes and engine requests out.

    tensors    the spec's Type ids <-> numpy dtypes
    reader     bounds-checked flatbuffer reading (a client's buffer is never trusted)
    writer     forward flatbuffer writing; tensor payloads are copied once
    decode     Request -> InferCall | MetadataCall, validated; numeric tensors zero-copy
    encode     InferResponse, error responses, MetadataResponse (and requests, for clients)
    metadata   MetadataResponse as data, and its JSON form
    model      the model's inputs, outputs and description
    config     InferRequest.config (JSON) -> sampling parameters
    inference  InferCall -> GenerationRequests; TokenEvents -> output tensors

Every problem with a request is raised as an `app.errors` class; the transport adapter
renders it as an `InferResponse` with one `Error` (code: the error's HTTP status).
"""
