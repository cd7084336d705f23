"""The OpenAI Responses API on the conversation core, sans-IO.

- `items`: `input` items read into one normal form (with ids), and that form as the
  conversation core's neutral messages;
- `tools`: function tools and `tool_choice` in the Responses API's flat shape;
- `request`: a body (with the stored context of `previous_response_id`) -> a
  `Conversation`;
- `exchange`: `ResponsesExchange`, the engine's events -> output items, the response object and
  the stream's events;
- `events`: every stream event's shape, for the live stream and for a stored response
  replayed;
- `record`: what the store keeps of a response;
- `compaction`: POST /v1/responses/compact, a conversation made into a window to go on
  with (its summary carried by a `compaction` item, which `items` reads back).

Running it (admission, the store, background runs, cancel) is `app.sessions.responses`;
the HTTP routes are `app.routes.apis.responses`.
"""
