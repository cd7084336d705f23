"""The HTTP APIs, one module each: OpenAI (`openai`), GraphPipe (`graphpipe`), the
liveness and readiness probes (`probes`), the browser playground (`playground`)."""
