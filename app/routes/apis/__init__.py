"""The HTTP APIs, one module each: OpenAI Completions and Chat (`openai`, with llm-d's
/render, /tokenize and LoRA admin), the Responses API (`responses`, with `compaction`)
and the Conversations API (`conversations`), Anthropic Messages (`anthropic`),
GraphPipe (`graphpipe`), llm-d's token-in/token-out (`tokens`), OpenAI's Files and
Batch APIs (`files`, `batches`) and Anthropic's Message Batches (`message_batches`), the
liveness and readiness probes (`probes`), the browser playground (`playground`).
"""
