"""Seeded hostile corpora, one per protocol, against the live server (real vLLM).

Each corpus is the inputs 0..N-1 of its protocol, each a pure function of (protocol,
index), so a failure names an index that reproduces it alone. N is 260 (what CI runs)
unless the environment sets `FUZZ_INPUTS`:

    FUZZ_INPUTS=10000 scripts/test tests/fuzz    # docs/testing.md: the figures at 10,000

- corpus.py: the mutators, protocol-independent (JSON trees, protobuf wire format, bytes)
  and `INPUTS` (N); harness.py: `run_corpus` (a few inputs at a time, each under a
  deadline) and `verdict` (no answer outside the shape, the server healthy, no engine
  request or admission ticket left), and the whole of an HTTP JSON protocol's corpus
  (`JsonRoutes`, `post_corpus`, `sse_events`); evergreen.py: what the Evergreen
  websocket and gRPC corpora share.
- test_fuzz_<protocol>.py: one protocol's seeds, inputs, judge of an answer, and test.

A new protocol is one module, test_fuzz_<protocol>.py. For an HTTP API with JSON bodies
(OpenAI Responses, Anthropic Messages), as test_fuzz_openai.py:

    ROUTES = JsonRoutes("anthropic", {"/v1/messages": [valid bodies...]}, {"/v1/messages": 1})

    def judge(route: str, response: httpx.Response) -> str | None:
        ...  # why the answer is neither the route's success nor the API's error shape
             # (a stream: read its named events with `sse_events`)

    async def test_anthropic_messages_corpus(live_server: LiveServer) -> None:
        verdict(live_server, "Anthropic Messages", await post_corpus(live_server, ROUTES, judge))

plus a check that `ROUTES.make_input` is seeded and that `DEFAULT_INPUTS` inputs cover
every route. Another transport writes its own `probe(index) -> Offence | None` (send
input `index`, judge what comes back) and calls `run_corpus(probe)` then `verdict`, as
the websocket and gRPC modules do. Valid seeds ask for a few tokens only, so that
accepted inputs finish fast.
"""
