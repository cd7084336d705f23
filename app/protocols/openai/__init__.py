"""The OpenAI Completions/Chat core: request bodies -> `GenerationRequest`s, and engine
`TokenEvent`s -> response bodies and stream chunks (plain dicts). No I/O, no framework."""
