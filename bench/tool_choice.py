"""tool_choice promises, sampled: does every finished answer under a tool choice that forces
a call (OpenAI's `required` and a named function, Anthropic's `any` and `tool`) hold at
least one well-formed call? Switchboard against `vllm serve`, on the same tiny model, flags
and samples, one server at a time.

Flags (both servers), the reference of issue 31: `--enable-auto-tool-choice
--tool-call-parser hermes --structured-outputs-config '{"backend": "xgrammar",
"disable_any_whitespace": true}'`. One strict tool, `get_weather(city: string, maxLength
12)`. Each API is sampled `--samples` times (default 100), split evenly over its modes:
{required, named} x {non-streamed, streamed} for Chat (choices drawn `n` at a time) and
the Responses API, {any, tool} x {non-streamed, streamed} for Messages; temperature 1,
`max_tokens` 256, parallel calls allowed (the clients' default).

Each answer is one of:
- `ok`: finished (chat `tool_calls`/`stop`, Responses `completed`, Messages
  `tool_use`/`end_turn`) with at least one call whose arguments are JSON (parsed
  strictly: a raw control character in a string fails) valid for the tool's schema, and
  every call so;
- `no call`: finished without a well-formed call (the promise broken: the calls came back
  as text, or with arguments that are not JSON or not the schema's);
- `length`: cut by the token limit (chat `length`, Responses `incomplete`, Messages
  `max_tokens`): honest, whatever it holds;
- `error`: an HTTP error or an error event (its status counted).
Streamed calls' argument fragments are joined as a client joins them; a call is also
counted `padded` when its streamed arguments hold whitespace outside strings (the
server's config forbids it).

Writes bench/results/tool_choice.json and the table between the `bench:tool_choice`
markers (docs/openai.md).

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/tool_choice.py \
        [--samples 100] [--targets switchboard "vllm serve"] [--apis chat responses messages]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from typing import Any

import harness
import httpx
import jsonschema
from harness import Server, markdown_table, publish

FLAGS = harness.TOOL_FLAGS
TARGETS = (harness.switchboard("switchboard", *FLAGS), harness.vllm_serve("vllm serve", *FLAGS))
MAX_TOKENS = 256
CONCURRENCY = 8
CHAT_N = 5  # choices per chat request
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
NAME = "get_weather"
PROMPT = "What is the weather in Paris?"
FINISHED = {"tool_calls", "stop", "completed", "tool_use", "end_turn"}
CUT = {"length", "incomplete", "max_tokens"}
# Each API's modes: (label, forcing choice, streamed).
MODES: dict[str, list[tuple[str, Any, bool]]] = {
    "chat": [
        ("required", "required", False),
        ("required", "required", True),
        ("named", {"type": "function", "function": {"name": NAME}}, False),
        ("named", {"type": "function", "function": {"name": NAME}}, True),
    ],
    "responses": [
        ("required", "required", False),
        ("required", "required", True),
        ("named", {"type": "function", "name": NAME}, False),
        ("named", {"type": "function", "name": NAME}, True),
    ],
    "messages": [
        ("any", {"type": "any"}, False),
        ("any", {"type": "any"}, True),
        ("tool", {"type": "tool", "name": NAME}, False),
        ("tool", {"type": "tool", "name": NAME}, True),
    ],
}


def _padded(arguments: str) -> bool:
    """Whitespace between the tokens of a JSON text (outside its strings)."""
    inside = escaped = False
    for c in arguments:
        if inside:
            escaped, inside = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            inside = True
        elif c in " \t\r\n":
            return True
    return False


def _verdict(finish: str | None, calls: list[tuple[str, str]]) -> str:
    """`calls`: (name, arguments as JSON text) as the client received them."""
    if finish in CUT:
        return "length"
    if finish not in FINISHED or not calls:
        return "no call"
    for name, arguments in calls:
        try:
            jsonschema.validate(json.loads(arguments), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return "no call"
        if name != NAME:
            return "no call"
    return "ok"


async def _sse(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise httpx.HTTPStatusError(
                str(response.status_code), request=response.request, response=response
            )
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


async def _chat(
    client: httpx.AsyncClient, base: str, choice: Any, stream: bool, seed: int
) -> list[tuple[str, list[tuple[str, str]], bool]]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [
            {"type": "function", "function": {"name": NAME, "parameters": SCHEMA, "strict": True}}
        ],
        "tool_choice": choice,
        "max_tokens": MAX_TOKENS,
        "n": CHAT_N,
        "seed": seed,
        "stream": stream,
    }
    url = f"{base}/v1/chat/completions"
    out = []
    if not stream:
        response = await client.post(url, json=body)
        response.raise_for_status()
        for c in response.json()["choices"]:
            calls = [
                (t["function"]["name"], t["function"]["arguments"])
                for t in c["message"].get("tool_calls") or ()
            ]
            out.append((c["finish_reason"], calls, False))
        return out
    finishes: dict[int, str] = {}
    calls_by: dict[int, dict[int, list[str]]] = {}
    for event in await _sse(client, url, body):
        if "error" in event:
            raise RuntimeError(event["error"])
        for c in event.get("choices") or ():
            i = c["index"]
            for t in c["delta"].get("tool_calls") or ():
                call = calls_by.setdefault(i, {}).setdefault(t["index"], ["", ""])
                function = t.get("function") or {}
                call[0] += function.get("name") or ""
                call[1] += function.get("arguments") or ""
            if c.get("finish_reason"):
                finishes[i] = c["finish_reason"]
    for i in range(CHAT_N):
        calls = [(n, a) for n, a in calls_by.get(i, {}).values()]
        out.append((finishes.get(i), calls, any(_padded(a) for _, a in calls)))
    return out


async def _responses(
    client: httpx.AsyncClient, base: str, choice: Any, stream: bool, seed: int
) -> list[tuple[str, list[tuple[str, str]], bool]]:
    body = {
        "model": "tiny",
        "input": PROMPT,
        "tools": [{"type": "function", "name": NAME, "parameters": SCHEMA, "strict": True}],
        "tool_choice": choice,
        "max_output_tokens": MAX_TOKENS,
        "store": False,
        "stream": stream,
    }
    url = f"{base}/v1/responses"
    if not stream:
        response = await client.post(url, json=body)
        response.raise_for_status()
        result = response.json()
        deltas: dict[str, str] = {}
    else:
        result = None
        deltas = {}
        for event in await _sse(client, url, body):
            kind = event.get("type")
            if kind == "response.function_call_arguments.delta":
                deltas[event["item_id"]] = deltas.get(event["item_id"], "") + event["delta"]
            elif kind in ("response.completed", "response.incomplete", "response.failed"):
                result = event["response"]
            elif kind == "error":
                raise RuntimeError(event)
        if result is None:
            raise RuntimeError("no terminal event")
    calls = [
        (item["name"], deltas.get(item["id"], item["arguments"]) if stream else item["arguments"])
        for item in result.get("output") or ()
        if item.get("type") == "function_call"
    ]
    padded = stream and any(_padded(a) for a in deltas.values())
    return [(result["status"], calls, padded)]


async def _messages(
    client: httpx.AsyncClient, base: str, choice: Any, stream: bool, seed: int
) -> list[tuple[str, list[tuple[str, str]], bool]]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [{"name": NAME, "input_schema": SCHEMA}],
        "tool_choice": choice,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }
    url = f"{base}/v1/messages"
    headers = {"anthropic-version": "2023-06-01"}
    if not stream:
        response = await client.post(url, json=body, headers=headers)
        response.raise_for_status()
        result = response.json()
        calls = [  # a block without its input is no well-formed call
            (b["name"], json.dumps(b["input"]) if "input" in b else "")
            for b in result["content"]
            if b["type"] == "tool_use"
        ]
        return [(result["stop_reason"], calls, False)]
    blocks: dict[int, list[str]] = {}
    stop = None
    for event in await _sse(client, url, body):
        kind = event.get("type")
        if kind == "content_block_start" and event["content_block"]["type"] == "tool_use":
            blocks[event["index"]] = [event["content_block"]["name"], ""]
        elif kind == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            blocks[event["index"]][1] += event["delta"]["partial_json"]
        elif kind == "message_delta":
            stop = event["delta"].get("stop_reason")
        elif kind == "error":
            raise RuntimeError(event)
    calls = [(n, a) for n, a in blocks.values()]
    return [(stop, calls, any(_padded(a) for _, a in calls))]


CLIENTS = {"chat": _chat, "responses": _responses, "messages": _messages}


async def sample(port: int, api: str, samples: int) -> dict[str, Any]:
    """`samples` answers of `api`, split over its modes; counts by mode and verdict."""
    base = f"http://127.0.0.1:{port}"
    gate = asyncio.Semaphore(CONCURRENCY)
    per_mode = samples // len(MODES[api])
    counts: dict[str, Counter[str]] = {}
    examples: dict[str, list[Any]] = {}

    async with httpx.AsyncClient(timeout=600) as client:

        async def one(key: str, choice: Any, stream: bool, seed: int) -> None:
            async with gate:
                try:
                    answers = await CLIENTS[api](client, base, choice, stream, seed)
                except httpx.HTTPStatusError as exc:
                    counts[key][f"error {exc.response.status_code}"] += 1
                    examples.setdefault(key, []).append(exc.response.text[:300])
                    return
                except RuntimeError as exc:
                    counts[key]["error event"] += 1
                    examples.setdefault(key, []).append(str(exc)[:300])
                    return
            for finish, calls, padded in answers:
                verdict = _verdict(finish, calls)
                counts[key][verdict] += 1
                if padded:
                    counts[key]["padded"] += 1
                if verdict == "no call" and len(examples.setdefault(key, [])) < 3:
                    examples[key].append([finish, calls])

        jobs = []
        for m, (label, choice, stream) in enumerate(MODES[api]):
            key = f"{label} {'streamed' if stream else 'not streamed'}"
            counts[key] = Counter()
            per_request = CHAT_N if api == "chat" else 1
            for i in range(per_mode // per_request):
                # Chat's choice j of a request seeded s is seeded s + j: seeds apart by
                # CHAT_N, and apart between modes, so that no two answers are the same draw.
                jobs.append(one(key, choice, stream, 10_000 * m + i * per_request))
        await asyncio.gather(*jobs)
    return {"counts": {k: dict(v) for k, v in counts.items()}, "examples": examples}


def _total(modes: dict[str, dict[str, int]], verdict: str) -> int:
    return sum(c.get(verdict, 0) for c in modes.values())


def table(figures: dict[str, dict[str, Any]], samples: int) -> str:
    rows = []
    for target, apis in figures.items():
        for api, result in apis.items():
            modes = result["counts"]
            errors = sum(n for c in modes.values() for k, n in c.items() if k.startswith("error"))
            finished = _total(modes, "ok") + _total(modes, "no call")
            rows.append(
                [
                    target,
                    api,
                    f"**{_total(modes, 'no call')}** / {finished}",
                    _total(modes, "length"),
                    errors,
                    _total(modes, "padded"),
                ]
            )
    header = [
        "server",
        "API",
        "finished without a well-formed call",
        "cut by max_tokens",
        "errors",
        "streamed calls padded",
    ]
    note = (
        f"{samples} answers per API (modes split evenly: required/named, any/tool, streamed "
        f"and not), temperature 1, max_tokens {MAX_TOKENS}, one strict tool "
        "`get_weather(city: string, maxLength 12)`; flags `--enable-auto-tool-choice "
        '--tool-call-parser hermes --structured-outputs-config \'{"backend": "xgrammar", '
        '"disable_any_whitespace": true}\'`. See bench/tool_choice.py.'
    )
    return "\n".join([*markdown_table(header, rows), "", note])


def main() -> None:
    names = [t.name for t in TARGETS]
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=100, help="answers per API")
    parser.add_argument("--targets", nargs="+", default=names, choices=names)
    parser.add_argument("--apis", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--no-publish", action="store_true", help="print, write nothing")
    args = parser.parse_args()
    harness.tiny_model()

    def one_start(server: Server, round_: harness.Round) -> harness.Figures:
        out = {}
        for api in args.apis:
            out[api] = asyncio.run(sample(server.port, api, args.samples))
            print(server.target.name, api, json.dumps(out[api]), flush=True)
        return out

    targets = [t for t in TARGETS if t.name in args.targets]
    results = harness.run_rounds(targets, one_start, rounds=1, name="tool_choice")
    figures = {t.name: results.raw[t.name][0][0] for t in targets}
    text = table(figures, args.samples)
    if args.no_publish:
        print(text)
        return
    publish("tool_choice", {"samples": args.samples, "figures": figures, **results.record()}, text)


if __name__ == "__main__":
    main()
