"""What an operator sees of each request: its id, its trace, its access-log line and its
metrics.

- `ids`: the `x-request-id` taken from the client or minted;
- `logs`: that id in every log line written while the request is served;
- `record`: `RequestRecord`, what is known of one request, filled as it is served;
- `callers`: `Caller`, who a connection's calls come from;
- `reports`: `Telemetry`, the app's one place that opens records and reports them once
  they end (span, access log, metrics);
- `tracing`: the OpenTelemetry tracer, on with `--otlp-traces-endpoint` (vLLM's spans of
  this process through it too);
- `otlp`: the OTLP encoding of a batch of spans its gRPC exporter sends (the SDK's
  exporter, a cheaper encoder);
- `access_log`, `metrics`: the line and the per-API, per-tenant figures of a record;
- `http`: the HTTP and websocket edge (an ASGI middleware).

The transports open a record at their edge (HTTP: `http.HttpTelemetry`; a websocket's
or a gRPC call's: its adapter, under the connection's or call's context) and hand it to
the road (`app.sessions.calls`, `app.admission`), which fills it where each stage
happens. Nothing here runs per token.
"""
