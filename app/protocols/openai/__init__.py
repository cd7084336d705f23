"""OpenAI's APIs, sans-IO: request bodies -> engine requests, and engine events -> response
bodies and stream chunks (plain dicts). No I/O, no framework.

- `completions`: `CompletionExchange`; `chat`: a Chat body onto the conversation core,
  and `ChatExchange`; `choices`: what they share (choices, the envelope, usage, the
  stream's end); `logprobs`: their logprobs shapes;
- `sampling`: OpenAI's sampling fields and extras; `structured`: `response_format` and
  `structured_outputs` as a constraint; `tools`: tools and `tool_choice`, calls in
  history and in the output;
- `admission_units`: what a Completions or Chat call asks admission for;
- `render`: llm-d's `/render` bodies; `conversations`: the Conversations API's rules;
- `batches`: the Files and Batch APIs' objects, input lines and output lines;
- `errors`: OpenAI's error shape for the one error tree;
- `responses/`: the Responses API.
"""
