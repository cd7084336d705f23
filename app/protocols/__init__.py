"""The protocol cores, sans-IO: no framework, no vLLM, no I/O. Each takes a client's
bodies or frames and returns engine requests and the answers to send, raising
`app.errors` for the client's mistakes.

- `exchange`: `Exchange`, one call of a call-shaped API as the shared road drives it;
  `accounting`: the usage and finishes every exchange counts;
- `bodies`: JSON bodies parsed and checked, for every API; `sampling`: sampling rules
  every protocol shares beyond the engine's limits;
- `batches`: a batch's record and lifecycle, in no API's shape;
- `conversation/`: every chat-shaped API's one plan (templating, tools, constraint,
  sampling, images) and its output read back;
- `openai/`: Completions, Chat and the Responses API (`openai/responses/`);
  `anthropic/`: Messages; `graphpipe/`: flatbuffers over HTTP;
- `evergreen/`: Evergreen's sessions of nodes and actions; `salience/`: Salience's
  token sessions;
- `smg`: SMG's gRPC workers' protocol; `tokens`: llm-d's token-in/token-out.
"""
