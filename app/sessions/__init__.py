"""The session layer: the protocol cores driven on the engine, for any transport.

Transport-independent and async. It knows asyncio, the engine seam (`app.engine.base`),
the error tree and the protocol cores; no web framework, server or gRPC. A transport
(HTTP, the websockets and gRPC in `app.routes`) decodes its frames into the cores'
messages, calls this layer, and renders what comes back and the `SwitchboardError`s
raised:

- `calls`: the one road of every call-shaped API (Completions, Chat, Responses,
  Messages): admission, the exchange built in the prompt thread, the engine's events
  pushed to it, its events or body handed out, hooks around its end; `generations`: a call's
  engine requests run together;
- `responses`: the Responses API on that road, and a websocket connection's own
  responses; `stored_responses`: their records, background runs, replay, and a cancel
  that wins wherever it lands;
- `lifetime`: one session's life on any transport (its opening, the drain's goodbye,
  its close), which every session-shaped adapter drives;
- `conversations`: the Conversations API on its store; `named`: engine requests their
  clients named, to abort by name (SMG's, llm-d's);
- `tasks`: a task group that cancels and awaits its calls;
- `evergreen`: one Evergreen session (`EvergreenRun`): its actions as tasks on the
  engine, `file://` refs read in a worker thread, the lifecycle of the core;
- `salience`: the Salience service (`SalienceRunner`): unary calls, Generates streamed
  from the engine and cancellable from any connection, images decoded in a worker thread.

Blocking work (image decoding, disk reads) never runs on the event loop here.
"""
