"""Switchboard: one in-process vLLM engine served over every protocol at once.

The packages, in the order data flows (transport -> protocol core -> engine):

- `routes/`: the transports (HTTP APIs, websockets, gRPC), thin adapters;
- `sessions/`: the protocol cores driven on the engine, for any transport;
- `protocols/`: the sans-IO protocol cores;
- `engine/`: the engine seam and the only package that imports vLLM;
- `batches/`: the batch APIs, and the runner that answers batches in a lane that yields
  to interactive traffic;
- `store/`: state that outlives a request (stored responses, conversations, sessions,
  files and batches);
- `telemetry/`: each request's id, trace, access-log line and metrics;
- `fleet/`: replicas of the server behind a real router, on one machine.

The modules around them:

- `main`: `create_app`; `objects`: `AppObjects`, the one place that builds and closes
  what the app holds; `cli`: `switchboard serve | fleet | make-tiny-...`;
- `config`: `Settings`; `errors`: the one error tree; `wire_text`: text every wire
  format can carry;
- `admission`: the one queue bound; `drain`: SIGTERM's sequence; `metrics`: /metrics;
- `pipe_child`: how the server's helper processes (body workers, the render process)
  start and stop; `heap`: the memory a big request held, given back once it is freed;
- `auth`: keys -> principals; `tenants`: the principal, roles and per-tenant limits;
- `tiny_model`, `tiny_vl_model`: the local tiny models the tests and the README run.
"""

__version__ = "0.1.0"
