"""The protocol clients the benchmarks share: one client's run of generations over each way
Switchboard serves tokens, and the messages and streams those runs are made of.

A client (`Client`) runs its prompts one after the other on one connection or session of
its own and returns a `Run`: seconds to each request's first output, each request's output
in order, and the output tokens the server reported.

- OpenAI completions and chat (HTTP + SSE, aiohttp: the client shares the machine's cores
  with the server, and httpx's per-chunk cost would be charged to the SSE side): greedy,
  `ignore_eos`, usage in the last chunk; the output is the text. The Responses API
  likewise, its named events read by type, usage from the terminal event.
- GraphPipe: one `POST /graphpipe` per prompt (a batch of one row, text in; `text` and
  `token_ids` out); the output is the token ids. It does not stream: no first-output times.
- Salience (binary protobuf frames on the websocket, or gRPC): one session, rewound
  (`truncating`) before each prompt's token ids, greedy (top_k 1); the output is the
  token ids, the tokens are Done's count.
- Evergreen (binary `SessionMessage`s on the websocket, or one gRPC StartSession call):
  one session, a GENERATE with a fresh prompt node per request, temperature 0; the output
  is the text. Evergreen reports no token count: its "tokens" are output fragments (one per
  engine step that produced text, about one a token).

Only the OpenAI routes take `ignore_eos`; a caller that needs every request to produce
`max_tokens` on the other protocols picks a prompt whose greedy continuation has no EOS
and checks the counts.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import aiohttp
import grpc
import numpy as np
import websockets
from google.protobuf import struct_pb2
from harness import Server

from app.protocols.graphpipe.encode import encode_infer_request
from fbs.graphpipe import graphpipe_generated as gp
from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_stubs
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_stubs
from schemas import salience_ws_pb2 as ws_pb

# A prompt as text and as token ids (tokenized before the clock starts).
Prompt = tuple[str, list[int]]


class Run(NamedTuple):
    ttfts: list[float]  # seconds to each request's first output (empty: not streamed)
    outputs: list[Any]  # each request's output, in order
    tokens: int  # output tokens the server reported (Evergreen: fragments)


Client = Callable[[Server, Sequence[Prompt], int], Awaitable[Run]]

# The protocols' workload: greedy, this fixed prompt (64 tokens of the tiny model's
# tokenizer), OUTPUT_TOKENS output tokens. Its greedy continuation (raw, and under the
# chat template) holds no EOS within OUTPUT_TOKENS, so the protocols without `ignore_eos`
# produce as many tokens as the OpenAI routes (the benchmarks check every count).
OUTPUT_TOKENS = 128
PROMPT = (
    "def merge_sorted(left, right):\n"
    '    """Merge two sorted lists into one."""\n'
    "    result = []\n"
    "    i = j = 0\n"
    "    while i < len(left) and j < len(right):\n"
    "        x = 1\n"
)


async def measure(
    client: Client, server: Server, prompt: Prompt, clients: int, requests: int
) -> tuple[dict[str, float], list[Run]]:
    """`clients` clients at once, `requests` each, `OUTPUT_TOKENS` tokens a request (the
    caller checks the runs), the server's frontend CPU read around them."""
    with server.meter(tokens=False) as meter:
        runs = await asyncio.gather(
            *(client(server, [prompt] * requests, OUTPUT_TOKENS) for _ in range(clients))
        )
    figures = meter.figures(clients * requests * OUTPUT_TOKENS)
    ttfts = [t for run in runs for t in run.ttfts]
    if ttfts:  # GraphPipe does not stream: no TTFT
        figures["ttft_p50_ms"] = statistics.median(ttfts) * 1000
    return figures, list(runs)


# -- OpenAI (HTTP + SSE) ----------------------------------------------------------------


def http_client(server: Server) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=server.http, timeout=aiohttp.ClientTimeout(total=300))


async def openai_stream(
    http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> tuple[str, float, int, int]:
    """POST a streamed completions or chat request (`stream` and usage are added):
    (output text, seconds to its first text, bytes sent, completion tokens from usage)."""
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    start = time.perf_counter()
    ttft, pieces, tokens = 0.0, [], 0
    headers = {"content-type": "application/json"}
    async with http.post(path, data=data, headers=headers) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{path} failed in its stream: {chunk['error']}")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                text = choice["delta"].get("content") if "delta" in choice else choice["text"]
                if text:
                    ttft = ttft or time.perf_counter() - start
                    pieces.append(text)
    return "".join(pieces), ttft, len(data), tokens


def chat_body(
    model: str, messages: list[dict[str, str]], max_tokens: int, *, ignore_eos: bool = False
) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}
    return {**body, "ignore_eos": True} if ignore_eos else body


async def completions_sse(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    ttfts, outputs, tokens = [], [], 0
    async with http_client(server) as http:
        for text, _ in prompts:
            body = {"model": server.model, "prompt": text, "temperature": 0}
            body |= {"max_tokens": max_tokens, "ignore_eos": True}
            out, ttft, _, n = await openai_stream(http, "/v1/completions", body)
            ttfts.append(ttft)
            outputs.append(out)
            tokens += n
    return Run(ttfts, outputs, tokens)


async def chat_sse(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    ttfts, outputs, tokens = [], [], 0
    async with http_client(server) as http:
        for text, _ in prompts:
            messages = [{"role": "user", "content": text}]
            body = chat_body(server.model, messages, max_tokens, ignore_eos=True)
            out, ttft, _, n = await openai_stream(http, "/v1/chat/completions", body)
            ttfts.append(ttft)
            outputs.append(out)
            tokens += n
    return Run(ttfts, outputs, tokens)


async def named_events(
    http: aiohttp.ClientSession, path: str, body: dict[str, Any], headers: dict[str, str]
) -> AsyncIterator[dict[str, Any]]:
    """POST `body` to `path` and yield the JSON data of each event of its SSE answer (the
    Responses API and Messages name their events and repeat the name as `type`)."""
    data = json.dumps(body).encode()
    async with http.post(path, data=data, headers=headers) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                yield json.loads(line[6:])


async def response_read(events: AsyncIterator[dict[str, Any]]) -> tuple[str, float, int]:
    """One response's events read up to its terminal one: (output text, seconds to its
    first text, output tokens from the terminal event's usage)."""
    start = time.perf_counter()
    ttft, pieces = 0.0, []
    async for event in events:
        kind = event["type"]
        if kind == "response.output_text.delta":
            ttft = ttft or time.perf_counter() - start
            pieces.append(event["delta"])
        elif kind in ("response.completed", "response.incomplete"):
            return "".join(pieces), ttft, event["response"]["usage"]["output_tokens"]
        elif kind in ("error", "response.failed"):
            raise RuntimeError(f"/v1/responses failed in its stream: {event}")
    raise RuntimeError("/v1/responses ended before its terminal event")


async def responses_stream(
    http: aiohttp.ClientSession, body: dict[str, Any]
) -> tuple[str, float, int]:
    """POST a streamed Responses API request (`stream` is added), read (`response_read`)."""
    headers = {"content-type": "application/json"}
    return await response_read(
        named_events(http, "/v1/responses", {**body, "stream": True}, headers)
    )


def responses_sse(store: bool) -> Client:
    """Greedy, `ignore_eos`, stored or not, one user message."""

    async def run(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
        ttfts, outputs, tokens = [], [], 0
        async with http_client(server) as http:
            for text, _ in prompts:
                body = {"model": server.model, "input": text, "temperature": 0, "store": store}
                body |= {"max_output_tokens": max_tokens, "ignore_eos": True}
                out, ttft, n = await responses_stream(http, body)
                ttfts.append(ttft)
                outputs.append(out)
                tokens += n
        return Run(ttfts, outputs, tokens)

    return run


async def responses_ws(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    """The Responses API's websocket mode: one connection, a `response.create` per prompt
    (greedy, `ignore_eos`, not stored), each read up to its terminal event."""
    ttfts, outputs, tokens = [], [], 0
    async with websockets.connect(f"{server.ws}/v1/responses", max_size=None) as ws:

        async def frames() -> AsyncIterator[dict[str, Any]]:
            while True:
                yield json.loads(await ws.recv())

        events = frames()  # one stream of frames, read a response at a time
        for text, _ in prompts:
            body = {"type": "response.create", "model": server.model, "input": text}
            body |= {"temperature": 0, "store": False, "max_output_tokens": max_tokens}
            await ws.send(json.dumps({**body, "ignore_eos": True}))
            out, ttft, n = await response_read(events)
            ttfts.append(ttft)
            outputs.append(out)
            tokens += n
    return Run(ttfts, outputs, tokens)


async def messages_sse(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    """Anthropic Messages, streamed: greedy, the text of the text deltas, the output
    tokens of the final message_delta (Messages has no `ignore_eos`: callers check)."""
    ttfts, outputs, tokens = [], [], 0
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    async with http_client(server) as http:
        for text, _ in prompts:
            body = {
                "model": server.model,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "messages": [{"role": "user", "content": text}],
            }
            start = time.perf_counter()
            ttft, pieces = 0.0, []
            async for event in named_events(http, "/v1/messages", body, headers):
                kind = event["type"]
                if kind == "content_block_delta" and event["delta"]["type"] == "text_delta":
                    ttft = ttft or time.perf_counter() - start
                    pieces.append(event["delta"]["text"])
                elif kind == "message_delta":
                    tokens += event["usage"]["output_tokens"]
                elif kind == "error":
                    raise RuntimeError(f"/v1/messages failed in its stream: {event}")
            ttfts.append(ttft)
            outputs.append("".join(pieces))
    return Run(ttfts, outputs, tokens)


# -- GraphPipe --------------------------------------------------------------------------


def graphpipe_request(prompt: str, max_tokens: int) -> bytes:
    """One `prompt` row in, `text` and `token_ids` out, greedy."""
    rows = np.empty(1, dtype=object)
    rows[0] = prompt.encode()
    config = json.dumps({"max_tokens": max_tokens, "temperature": 0}).encode()
    return bytes(encode_infer_request([rows], ["prompt"], ["text", "token_ids"], config))


def graphpipe_token_ids(body: bytes) -> list[int]:
    """The one row of `token_ids` in an InferResponse (the second output), padding dropped."""
    answer = gp.InferResponse.GetRootAs(body, 0)
    if answer.ErrorsLength():
        error = answer.Errors(0)
        raise RuntimeError(f"GraphPipe error {error.Code()}: {error.Message().decode()}")
    ids = answer.OutputTensors(1).DataAsNumpy().view("<i8")
    return [int(i) for i in ids if i >= 0]


async def graphpipe(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    outputs: list[Any] = []
    async with http_client(server) as http:
        for text, _ in prompts:
            headers = {"content-type": "application/octet-stream"}
            body = graphpipe_request(text, max_tokens)
            async with http.post("/graphpipe", data=body, headers=headers) as response:
                outputs.append(graphpipe_token_ids(await response.read()))
    return Run([], outputs, sum(map(len, outputs)))


# -- Salience ---------------------------------------------------------------------------


def salience_generate(session: str, ids: list[int], max_tokens: int) -> pb.GenerateRequest:
    """A greedy Generate of `ids` on a session rewound to empty."""
    return pb.GenerateRequest(
        session_id=session,
        append_tokens=ids,
        offset=0,
        truncating=True,
        max_tokens=max_tokens,
        top_k=1,
    )


async def salience_grpc(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    ttfts, outputs, tokens = [], [], 0
    async with grpc.aio.insecure_channel(server.grpc) as channel:
        stub = salience_stubs.SalienceStub(channel)
        opened = await stub.OpenSession(pb.OpenSessionRequest(model=server.model))
        for _, ids in prompts:
            start, first, decoded = time.perf_counter(), 0.0, []
            async for event in stub.Generate(salience_generate(opened.session_id, ids, max_tokens)):
                if event.HasField("token"):
                    first = first or time.perf_counter() - start
                    decoded.append(event.token.id)
                else:
                    tokens += event.done.completion_tokens
            ttfts.append(first)
            outputs.append(decoded)
    return Run(ttfts, outputs, tokens)


async def salience_ws(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    ttfts, outputs, tokens = [], [], 0
    async with websockets.connect(f"{server.ws}/salience/ws", max_size=None) as ws:
        open_session = pb.OpenSessionRequest(model=server.model)
        await ws.send(ws_pb.ClientFrame(id="o", open_session=open_session).SerializeToString())
        session = ws_pb.ServerFrame.FromString(await ws.recv()).open_session.session_id
        for r, (_, ids) in enumerate(prompts):
            generate = salience_generate(session, ids, max_tokens)
            frame = ws_pb.ClientFrame(id=f"g{r}", generate=generate)
            start, first, decoded = time.perf_counter(), 0.0, []
            await ws.send(frame.SerializeToString())
            while True:
                reply = ws_pb.ServerFrame.FromString(await ws.recv())
                if reply.event.HasField("token"):
                    first = first or time.perf_counter() - start
                    decoded.append(reply.event.token.id)
                elif reply.event.HasField("done"):
                    tokens += reply.event.done.completion_tokens
                    break
                else:
                    raise RuntimeError(f"Generate failed: {reply}")
            ttfts.append(first)
            outputs.append(decoded)
    return Run(ttfts, outputs, tokens)


# -- Evergreen --------------------------------------------------------------------------


def evergreen_action(prompt: str, output: str, max_tokens: int) -> Any:
    """A greedy GENERATE of node `prompt` into node `output`."""
    config = struct_pb2.Struct()
    config.update({"temperature": 0, "max_tokens": max_tokens})
    action = service_pb.SessionMessage().actions.add(name="GENERATE")
    action.inputs.add(name="prompt", id=prompt)
    action.outputs.add(name="response", id=output)
    action.configs.add().Pack(config)
    return action


def evergreen_leaf(message: Any, node_id: str, text: str) -> None:
    """Add a text chunk node `node_id` to `message`."""
    fragment = message.node_fragments.add(id=node_id)
    fragment.chunk_fragment.metadata.mimetype = "text/plain"
    fragment.chunk_fragment.data = text.encode()


def evergreen_generate(r: int, prompt: str, max_tokens: int) -> service_pb.SessionMessage:
    """Request `r` of a session: prompt node p{r} holding `prompt`, output node r{r}."""
    message = service_pb.SessionMessage()
    message.actions.append(evergreen_action(f"p{r}", f"r{r}", max_tokens))
    evergreen_leaf(message, f"p{r}", prompt)
    return message


async def evergreen_output(
    receive: Callable[[], Awaitable[service_pb.SessionMessage]], output: str, start: float
) -> tuple[bytes, float, int]:
    """Read node `output` to its last fragment: (its bytes, seconds from `start` to its
    first fragment, fragments)."""
    pieces, first, fragments = [], 0.0, 0
    while True:
        reply = await receive()
        if reply.actions:
            raise RuntimeError(f"session aborted: {reply}")
        for fragment in reply.node_fragments:
            if fragment.id != output:
                raise RuntimeError(f"fragment of node {fragment.id!r}, expected {output!r}")
            first = first or time.perf_counter() - start
            pieces.append(fragment.chunk_fragment.data)
            fragments += 1
            if not fragment.continued:
                return b"".join(pieces), first, fragments


async def evergreen_grpc(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    ttfts, outputs, fragments = [], [], 0
    async with grpc.aio.insecure_channel(server.grpc) as channel:
        call = evergreen_stubs.EvergreenServiceStub(channel).StartSession()

        async def receive() -> service_pb.SessionMessage:
            message: service_pb.SessionMessage = await call.read()
            return message

        for r, (prompt, _) in enumerate(prompts):
            start = time.perf_counter()
            await call.write(evergreen_generate(r, prompt, max_tokens))
            text, first, n = await evergreen_output(receive, f"r{r}", start)
            ttfts.append(first)
            outputs.append(text.decode())
            fragments += n
        await call.done_writing()
        if await call.read() is not grpc.aio.EOF:
            raise RuntimeError("the session sent more than its outputs")
    return Run(ttfts, outputs, fragments)


async def evergreen_ws(server: Server, prompts: Sequence[Prompt], max_tokens: int) -> Run:
    ttfts, outputs, fragments = [], [], 0
    async with websockets.connect(f"{server.ws}/evergreen/ws", max_size=None) as ws:

        async def receive() -> service_pb.SessionMessage:
            return service_pb.SessionMessage.FromString(await ws.recv())

        for r, (prompt, _) in enumerate(prompts):
            start = time.perf_counter()
            await ws.send(evergreen_generate(r, prompt, max_tokens).SerializeToString())
            text, first, n = await evergreen_output(receive, f"r{r}", start)
            ttfts.append(first)
            outputs.append(text.decode())
            fragments += n
    return Run(ttfts, outputs, fragments)
