"""Anthropic's Messages API on the conversation core (`app.protocols.conversation`).

- `messages`: a Messages (or count_tokens) body -> a neutral `Conversation`, block by
  block, every error naming Anthropic's field; the admission bound of a body;
- `exchange`: `MessagesExchange`, the plan's events as Anthropic's message and stream events;
- `errors`: Anthropic's error types and statuses for the one error tree;
- `batches`: Message Batches: the create body's requests, the batch object, the results.

The transport (`app.routes.apis.anthropic`) is the shared HTTP pump; nothing here does
I/O or knows a framework.
"""
