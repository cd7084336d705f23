"""The conversation core: every chat-shaped API (OpenAI Chat Completions, the Responses
API, Anthropic Messages) translates its body onto ONE plan and encodes the neutral
output back in its own shape; none repeats another's templating, tool planning,
constraint, sampling or parsing.

- `plan`: `Conversation` (neutral messages, tools, tool choice, output constraint,
  sampling, the API's field names) -> `ChatPlan` (prompt token ids, one engine request
  per choice, the tool-call parser), built once, off the event loop.
- `output`: `ChoiceOutput`, one choice's engine events -> visible text and tool calls,
  streamed as deltas or parsed whole, and its neutral finish.
- `images`: images a client sends inline, and their blocks in the templated prompt.
- `blocks`: the open-block state machine that cuts a stream into items or content
  blocks (Responses' and Messages').
- `bound`: admission's bound of a chat body's prompt tokens, one rule for every API.

An API adds a translator (its body -> `Conversation`) and an encoder (the plan's events
-> its bodies and stream events) as an `app.protocols.exchange.Exchange`; the HTTP pump, the
error handling, admission and aborts are shared.
"""
