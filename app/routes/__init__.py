"""The transports: thin adapters that move each protocol's frames between its clients and
its core (`app.protocols`), the session layer (`app.sessions`) and the engine.

- `http/`: what every HTTP API shares: JSON bodies, the error responders each API
  registers and the last-resort middleware, SSE, disconnect watching, fanned-out
  generations.
- `apis/`: the HTTP APIs, one module each (OpenAI, GraphPipe, probes, the playground).
- `ws/`: the websocket pump and the Salience and Evergreen sockets on it.
- `grpc/`: the native gRPC server and its Salience and Evergreen services.
- `body_worker`: bodies over 256 KiB parsed in child processes, fairly per client, off
  the serving process's interpreter lock; `body_pace`: the pace each client's big
  bodies are taken in at (a flood of them waits unread).
- `raw_send`: the server's own `send`, kept in each scope so that what streams writes
  past the middleware stack; `send_writer`: ordered writes to it from synchronous code.
- `deps`: the app's objects (`app.objects`: engine, stores, the Responses,
  Conversations and Salience APIs) and its settings, admission and drain handed out as
  typed dependencies, and the API key check, for every transport.
"""
