"""vLLM's own chat serving, `OpenAIServingChat` as `vllm serve --tool-call-parser hermes
--enable-auto-tool-choice [--reasoning-parser NAME]` sets it up, run without an engine:
the peer the parsing unit tests (tool calls, reasoning) hold the chat core to.

Built without its __init__, fields set as it sets them, minus what its full and stream
generators never touch (the engine client, the renderer); fed crafted text as vLLM's
`RequestOutput`s, one per piece `(token ids, text)`. Everything else is vLLM's own code
(never re-implemented here). vLLM is imported only when called: collecting a test module
costs nothing.
"""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import AsyncIterator
from typing import Any

Piece = tuple[list[int], str]


def serving_chat(tokenizer: Any, model: str, *, reasoning_parser: str = "") -> Any:
    """vLLM's `OpenAIServingChat` for `model` (what its parsers read of its ModelConfig:
    the name; and, for the call id style, its hf_config's model_type, which a Llama leaves
    at "random" ids)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.parser import ParserManager

    model_config = types.SimpleNamespace(model=model)
    serving = OpenAIServingChat.__new__(OpenAIServingChat)
    serving.__dict__.update(
        model_config=model_config,
        parser_cls=ParserManager.get_parser(
            tool_parser_name="hermes",
            reasoning_parser_name=reasoning_parser,
            enable_auto_tools=True,
            tool_strict_level="auto",
            model_name=model,
            is_harmony=False,
            tokenizer=tokenizer,
        ),
        enable_auto_tools=True,
        response_role="assistant",
        request_logger=None,
        enable_log_outputs=False,
        enable_log_deltas=True,
        enable_force_include_usage=False,
        _include_reasoning_tokens_details=False,
        system_fingerprint=None,
        enable_prompt_tokens_details=False,
        enable_per_request_metrics=False,
        chat_template=None,
        chat_template_content_format="auto",
        default_chat_template_kwargs={},
        return_tokens_as_token_ids=False,
    )
    return serving


def full_answer(
    serving: Any, tokenizer: Any, body: dict[str, Any], pieces: list[Piece]
) -> dict[str, Any]:
    """The JSON vLLM answers `body` (not streamed) with when the model writes `pieces`."""
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata

    request = _request(body)
    response = asyncio.run(
        serving.chat_completion_full_generator(
            request,
            _outputs(pieces),
            "r",
            "tiny",
            [],
            tokenizer,
            RequestResponseMetadata(request_id="r"),
            parser=serving._make_parser(request, tokenizer, {}),
        )
    )
    answer: dict[str, Any] = json.loads(response.model_dump_json())
    return answer


def stream_chunks(
    serving: Any, tokenizer: Any, body: dict[str, Any], pieces: list[Piece]
) -> list[dict[str, Any]]:
    """The chunks vLLM streams for `body` when the model writes `pieces` (its
    `data: [DONE]` checked and left out)."""
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata

    async def collect() -> list[str]:
        generator = serving.chat_completion_stream_generator(
            _request(body),
            _outputs(pieces),
            "r",
            "tiny",
            [],
            tokenizer,
            RequestResponseMetadata(request_id="r"),
        )
        return [line async for line in generator]

    lines = [line.strip() for line in asyncio.run(collect())]
    assert lines[-1] == "data: [DONE]", lines
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def _request(body: dict[str, Any]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate(body)


async def _outputs(pieces: list[Piece]) -> AsyncIterator[Any]:
    from vllm.outputs import CompletionOutput, RequestOutput

    for i, (ids, text) in enumerate(pieces):
        last = i == len(pieces) - 1
        output = CompletionOutput(0, text, ids, None, None, finish_reason="stop" if last else None)
        yield RequestOutput("r", None, [1], None, [output], last)
