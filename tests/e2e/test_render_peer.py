"""The llm-d render routes against vLLM's own answer: the same body is POSTed to the live
server and to vLLM 0.32's GPU-less render server (`vllm.entrypoints.launchers.render.entry`,
what `vllm serve --enable-scale-out` mounts as /v1/*/render), started here as a subprocess
on the tiny model with the live server's served name and tool flags. Both must give the
same token ids per item, the same shape (object vs list, the same keys, request ids in the
same form) and the same values for the sampling fields both set.

The peer builds no engine: it runs no child process and allocates no KV cache, so it
starts in seconds beside the live server's engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from vllm import SamplingParams

from tests.conftest import LIVE_MODEL, LiveServer, free_port, tiny_model_path

pytestmark = pytest.mark.e2e

START_TIMEOUT = 120.0
# The live server's (tests/conftest.py): no whitespace inside constrained JSON.
STRUCTURED_OUTPUTS = {
    "backend": "xgrammar",
    "disable_any_whitespace": True,
}  # imports dominate (~7 s idle); generous for a loaded 2-core box

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        "strict": True,
    },
}
BARE = {"type": "function", "function": {"name": "ping"}}  # no description, no parameters
CALLED = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21"},
]
SAMPLING = {"max_tokens": 7, "temperature": 0.5, "seed": 3, "stop": ["\n\n", "END"], "top_k": 5}

CHAT_BODIES: dict[str, dict[str, Any]] = {
    "system+user": {"messages": MESSAGES, **SAMPLING},
    "tools": {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "auto", "max_tokens": 9},
    "stream": {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
    "defaults": {"messages": [{"role": "user", "content": "hi"}]},
    "regex": {"messages": MESSAGES, "structured_outputs": {"regex": "a+"}, "top_p": 0.9},
    # Tools reach the template as vLLM's validated tool model dumps them (its defaults
    # included: a tool without a description renders `"description": null`).
    "tool without description or parameters": {
        "messages": MESSAGES,
        "tools": [BARE],
        "tool_choice": "none",
    },
    "strict tool beside another": {"messages": MESSAGES, "tools": [WEATHER, TIME]},
    "required": {"messages": MESSAGES, "tools": [TIME], "tool_choice": "required"},
    "named": {
        "messages": MESSAGES,
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "calls and a tool answer in the history": {"messages": CALLED, "tools": [WEATHER]},
    "developer role and text parts": {
        "messages": [
            {"role": "developer", "content": "Be terse."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    },
    "continue the final message": {
        "messages": [*MESSAGES, {"role": "assistant", "content": "Hello, I"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
    "template kwargs": {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}},
}
COMPLETION_BODIES = {
    "text": {"prompt": "def main():", **SAMPLING},
    "batch": {"prompt": ["def main():", "import os", "x"], "n": 2, "temperature": 0.8},
    "token ids": {"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 4, "stop": "ab", "seed": 1},
    "one token-id prompt": {"prompt": [11, 12, 13], "max_tokens": 3},
    "choice": {"prompt": "x", "structured_outputs": {"choice": ["yes", "no"]}, "min_tokens": 1},
}
# Sampling fields compared on every item. vLLM's SamplingParams is a msgspec struct with
# `omit_defaults`: a field it leaves out holds SamplingParams' default.
COMPARED = (
    "n",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "logprobs",
    "skip_special_tokens",
    "include_stop_str_in_output",
)


def _children(pid: int) -> list[str]:
    return [" ".join(c.cmdline()) for c in psutil.Process(pid).children(recursive=True)]


@pytest.fixture(scope="module")
def vllm_render(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's render-only server on the tiny model; its base URL. Always terminated."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-render") / "server.log"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.render.entry",
        "--model",
        str(tiny_model_path()),
        "--served-model-name",
        LIVE_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        # The live server's flags: the tiny template writes hermes-style calls.
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--structured-outputs-config",
        json.dumps(STRUCTURED_OUTPUTS),
        "--disable-uvicorn-access-log",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"

    def output() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM render server exited ({proc.returncode}):\n{output()}")
            try:
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM render server not up in {START_TIMEOUT} s:\n{output()}")
            time.sleep(0.25)
        # No engine: no engine-core (or any) child process, no KV cache sized.
        assert _children(proc.pid) == [], output()
        assert "KV cache" not in output() and "EngineCore" not in output(), output()
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _both(live_url: str, peer_url: str, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
    body = {"model": LIVE_MODEL, **body}
    ours = httpx.post(f"{live_url}{path}", json=body, timeout=30)
    theirs = httpx.post(f"{peer_url}{path}", json=body, timeout=30)
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text
    return ours.json(), theirs.json()


def _same_item(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["token_ids"] == theirs["token_ids"]
    assert list(ours) == list(theirs)  # the same keys, in vLLM's order
    for key in ("features", "model", "stream", "stream_options", "priority", "output_mode"):
        assert ours[key] == theirs[key], key
    # `chatcmpl-<id>`, `cmpl-<id>`, `cmpl-<id>-<i>`: the same prefix and suffix form.
    assert ours["request_id"].count("-") == theirs["request_id"].count("-")
    assert ours["request_id"].split("-")[0] == theirs["request_id"].split("-")[0]
    mine, peer = ours["sampling_params"], theirs["sampling_params"]
    defaults = SamplingParams()
    differ = {
        k: (mine.get(k), peer.get(k, getattr(defaults, k)))
        for k in COMPARED
        if mine.get(k) != peer.get(k, getattr(defaults, k))
    }
    assert not differ, f"sampling_params (ours, vLLM): {differ}"
    # Ours names only the constraint; vLLM dumps every StructuredOutputsParams field.
    constraint = mine["structured_outputs"] or {}
    theirs_named = {k: peer["structured_outputs"][k] for k in constraint}
    if "structural_tag" in constraint:
        # A forced call's tag is vLLM's own, except that each JSON schema in it is the
        # grammar xgrammar makes of it under the server's `disable_any_whitespace`, its
        # strings corrected (app/engine/vllm/call_grammar.py; vLLM 0.32 compiles a tag's
        # schemas with free whitespace, and xgrammar's strings take raw controls).
        tag, peer_tag = (json.loads(c["structural_tag"]) for c in (constraint, theirs_named))
        assert '"json_schema"' in json.dumps(peer_tag)
        assert tag == _schemas_as_grammars(peer_tag)
    else:
        assert theirs_named == constraint


def _schemas_as_grammars(node: Any) -> Any:
    from app.engine.vllm.json_grammar import json_grammar

    if isinstance(node, dict):
        if node.get("type") == "json_schema":
            schema = node["json_schema"]  # a tool that is not strict: still an object
            schema = {"type": "object"} if schema is True else schema
            whitespace = not STRUCTURED_OUTPUTS["disable_any_whitespace"]
            return {"type": "grammar", "grammar": json_grammar(schema, whitespace)}
        return {k: _schemas_as_grammars(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_schemas_as_grammars(v) for v in node]
    return node


@pytest.mark.parametrize("case", list(CHAT_BODIES))
def test_chat_render_matches_vllm(live_server: LiveServer, vllm_render: str, case: Any) -> None:
    ours, theirs = _both(
        live_server.base_url, vllm_render, "/v1/chat/completions/render", CHAT_BODIES[case]
    )
    assert isinstance(ours, dict) and isinstance(theirs, dict)
    _same_item(ours, theirs)


@pytest.mark.parametrize("case", list(COMPLETION_BODIES))
def test_completion_render_matches_vllm(
    live_server: LiveServer, vllm_render: str, case: Any
) -> None:
    ours, theirs = _both(
        live_server.base_url, vllm_render, "/v1/completions/render", COMPLETION_BODIES[case]
    )
    assert isinstance(ours, list) and isinstance(theirs, list)
    assert len(ours) == len(theirs)
    for mine, peer in zip(ours, theirs, strict=True):
        _same_item(mine, peer)


TOKENIZE_BODIES = {
    "tools": {"messages": MESSAGES, "tools": [BARE, WEATHER]},
    "history and template switches": {
        "messages": CALLED,
        "tools": [WEATHER],
        "add_generation_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


@pytest.mark.parametrize("case", list(TOKENIZE_BODIES))
def test_tokenize_renders_tools_and_template_kwargs_as_vllm(
    live_server: LiveServer, vllm_render: str, case: str
) -> None:
    ours, theirs = _both(live_server.base_url, vllm_render, "/tokenize", TOKENIZE_BODIES[case])
    assert ours["tokens"] == theirs["tokens"]
    assert ours["count"] == theirs["count"]
