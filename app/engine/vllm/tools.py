"""vLLM's tool calling behind the neutral `ToolSupport`: the tools and tool choice are
checked by vLLM's own request model, the forcing constraint (a structural tag or JSON
schema) is what vLLM's parser sets for `required` and named choices, and calls are read
by vLLM's parser chosen with `--tool-call-parser` (enabled for `auto` by
`--enable-auto-tool-choice`), as `vllm serve` does; with `parallel_tool_calls: false`
only the first call is kept, by vLLM's own filter (as `vllm serve` filters its answer,
whatever the model wrote). vLLM side of the seam.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
from vllm.exceptions import VLLMValidationError
from vllm.parser import ParserManager
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.v1.engine.async_llm import AsyncLLM

from app.engine.constraints import Constraint
from app.engine.tools import (
    ParsedDelta,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    ToolPlan,
)
from app.errors import ConfigError, InvalidRequest


def _constraint(request: ChatCompletionRequest) -> Constraint | None:
    outputs = request.structured_outputs
    if outputs is None:
        return None
    if outputs.structural_tag is not None:
        return Constraint("structural_tag", outputs.structural_tag, "tool_choice")
    if outputs.json is not None:
        spec = outputs.json if isinstance(outputs.json, str) else json.dumps(outputs.json)
        return Constraint("json", spec, "tool_choice")
    return None


class _Parser:
    """One choice's parser: vLLM's unified parser (tool parser, and the JSON forms of
    `required` and named choices) for one request."""

    def __init__(self, parser: Any, request: ChatCompletionRequest) -> None:
        self._parser = parser
        self._request = request

    def parse(self, text: str, token_ids: Sequence[int]) -> ParsedOutput:
        _, content, calls = self._parser.parse(
            text, self._request, enable_auto_tools=True, model_output_token_ids=token_ids
        )
        calls = maybe_filter_parallel_tool_calls(calls or [], self._request)
        return ParsedOutput(
            content=content,
            tool_calls=tuple(
                ToolCall(
                    id=getattr(call, "id", None) or make_tool_call_id(),
                    name=call.name,
                    arguments=call.arguments,
                )
                for call in calls or ()
            ),
        )

    def feed(
        self,
        text: str,
        token_ids: Sequence[int],
        *,
        prompt_token_ids: Sequence[int] | None,
        finished: bool,
    ) -> ParsedDelta:
        delta = self._parser.parse_delta(
            text,
            list(token_ids),
            self._request,
            list(prompt_token_ids) if prompt_token_ids is not None else None,
            finished=finished,
        )
        if delta is None:
            return ParsedDelta(None, ())
        delta = maybe_filter_parallel_tool_calls(delta, self._request)
        calls = []
        for call in delta.tool_calls or ():
            function = call.function
            calls.append(
                ToolCallDelta(
                    index=call.index,
                    id=call.id,
                    name=function.name if function is not None else None,
                    arguments=function.arguments if function is not None else None,
                )
            )
        return ParsedDelta(delta.content or None, tuple(calls))


class VllmToolSupport:
    def __init__(
        self, llm: AsyncLLM, tool_call_parser: str | None, auto: bool, strict_level: str
    ) -> None:
        self._tokenizer = llm.get_tokenizer()
        self._model_config = llm.model_config
        self._auto = auto
        try:
            self._parser_cls = ParserManager.get_parser(
                tool_parser_name=tool_call_parser,
                enable_auto_tools=auto,
                tool_strict_level=strict_level,
                model_name=self._model_config.model,
                tokenizer=self._tokenizer,
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"--tool-call-parser {tool_call_parser!r}: {exc}") from exc

    def plan(
        self,
        tools: Sequence[Mapping[str, Any]],
        tool_choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool | None,
    ) -> ToolPlan:
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": ""}],
            "tools": list(tools),
        }
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            body["parallel_tool_calls"] = parallel_tool_calls
        try:
            request = ChatCompletionRequest.model_validate(body)
        except VLLMValidationError as exc:
            raise InvalidRequest(str(exc), param=exc.parameter or "tools") from exc
        except pydantic.ValidationError as exc:
            error = exc.errors()[0]
            where = [str(p) for p in error["loc"] if p not in ("body",)]
            param = where[0] if where and where[0] in ("tools", "tool_choice") else "tools"
            raise InvalidRequest(f"{'.'.join(where)}: {error['msg']}", param=param) from exc
        choice = request.tool_choice
        if choice in (None, "none"):
            return ToolPlan(None)
        if self._parser_cls is None:
            if choice == "auto":
                raise InvalidRequest(
                    '"auto" tool choice requires --enable-auto-tool-choice and '
                    "--tool-call-parser to be set",
                    param="tool_choice",
                )
            raise InvalidRequest(
                "tool_choice other than none requires --tool-call-parser to be set",
                param="tool_choice",
            )
        parser_cls = self._parser_cls
        adjusted = parser_cls(
            self._tokenizer, request.tools, model_config=self._model_config
        ).adjust_request(request.model_copy(deep=True))

        def new_parser() -> _Parser:
            return _Parser(
                parser_cls(self._tokenizer, adjusted.tools, model_config=self._model_config),
                adjusted,
            )

        return ToolPlan(
            _constraint(adjusted),
            new_parser,
            skip_special_tokens=adjusted.skip_special_tokens,
        )
