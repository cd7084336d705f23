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
from vllm.config import StructuredOutputsConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
from vllm.exceptions import VLLMValidationError
from vllm.parser import ParserManager
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM

from app.engine.constraints import Constraint
from app.engine.tools import (
    NamedTool,
    ParsedDelta,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolFields,
    ToolPlan,
    ToolSpec,
)
from app.engine.vllm.call_grammar import forced_call
from app.errors import ConfigError, InvalidRequest


def _unchanged(outputs: StructuredOutputsParams, constraint: Constraint | None) -> bool:
    """vLLM's parser left the call's own response format (`constraint`) as it was: it
    only ever sets a structural tag (never a client's) or a JSON schema."""
    if outputs.structural_tag is not None:
        return False
    if outputs.json is None:
        return True
    if constraint is None or constraint.kind != "json" or not isinstance(constraint.spec, str):
        return False
    schema = outputs.json if not isinstance(outputs.json, str) else json.loads(outputs.json)
    return bool(schema == json.loads(constraint.spec))


def _structured_outputs(constraint: Constraint) -> dict[str, Any]:
    """A response format as vLLM's request model takes it, so that its parser can
    combine it with an `auto` tool choice as `vllm serve` does."""
    if constraint.kind == "json_object":
        return {"json_object": True}
    if constraint.kind == "choice":
        return {"choice": list(constraint.spec or ())}
    return {constraint.kind: constraint.spec}


def _tool_body(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = dict(tool.parameters)
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _choice_body(choice: ToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, NamedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


class _Parser:
    """One choice's parser: vLLM's unified parser (tool parser, and the JSON forms of
    `required` and named choices) for one request."""

    def __init__(self, parser: Any, request: ChatCompletionRequest) -> None:
        self._parser = parser
        self._request = request

    def parse(self, text: str, token_ids: Sequence[int]) -> ParsedOutput:
        reasoning, content, calls = self._parser.parse(
            text, self._request, enable_auto_tools=True, model_output_token_ids=token_ids
        )
        calls = maybe_filter_parallel_tool_calls(calls or [], self._request)
        return ParsedOutput(
            reasoning=reasoning,
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
        return ParsedDelta(delta.content or None, tuple(calls), delta.reasoning or None)


class VllmToolSupport:
    def __init__(
        self,
        llm: AsyncLLM,
        tool_call_parser: str | None,
        auto: bool,
        strict_level: str,
        *,
        reasoning_parser: str | None = None,
    ) -> None:
        """`reasoning_parser`: vLLM's reasoning parser for the model's format, as the
        engine's `--reasoning-parser` names it (None: the output holds no reasoning to
        read). Forced calls follow the engine's `--structured-outputs-config` (its
        backend and whitespace rule), as any constrained output does."""
        self._tokenizer = llm.get_tokenizer()
        self._model_config = llm.model_config
        self._grammar_config: StructuredOutputsConfig = llm.vllm_config.structured_outputs_config
        self._auto = auto
        self._reasoning = bool(reasoning_parser)
        try:
            self._parser_cls = ParserManager.get_parser(
                tool_parser_name=tool_call_parser,
                reasoning_parser_name=reasoning_parser or None,
                enable_auto_tools=auto,
                tool_strict_level=strict_level,
                model_name=self._model_config.model,
                tokenizer=self._tokenizer,
            )
        except (TypeError, ValueError, KeyError) as exc:
            name = tool_call_parser if reasoning_parser is None else reasoning_parser
            raise ConfigError(f"the output parser {name!r}: {exc}") from exc
        self._reads_calls = (
            self._parser_cls is not None and self._parser_cls.tool_parser_cls is not None
        )

    def _request(
        self,
        tools: Sequence[ToolSpec],
        tool_choice: ToolChoice | None,
        parallel_tool_calls: bool | None,
        fields: ToolFields,
        constraint: Constraint | None,
    ) -> ChatCompletionRequest:
        """vLLM's own request model over the tools: its validation, and what its tool
        parser adjusts."""
        body: dict[str, Any] = {"messages": [{"role": "user", "content": ""}]}
        if tools:  # vLLM refuses an empty list
            body["tools"] = [_tool_body(tool) for tool in tools]
        if tool_choice is not None:
            body["tool_choice"] = _choice_body(tool_choice)
        if parallel_tool_calls is not None:
            body["parallel_tool_calls"] = parallel_tool_calls
        if constraint is not None:
            body["structured_outputs"] = _structured_outputs(constraint)
        names = {"tools": fields.tools, "tool_choice": fields.tool_choice}
        try:
            return ChatCompletionRequest.model_validate(body)
        except VLLMValidationError as exc:
            where = names.get(exc.parameter or "tools", fields.tools)
            raise InvalidRequest(str(exc.args[0]) if exc.args else "", param=where) from exc
        except pydantic.ValidationError as exc:
            error = exc.errors()[0]
            loc = [str(p) for p in error["loc"] if p not in ("body",)]
            top = names.get(loc[0], fields.tools) if loc else fields.tools
            where = ".".join([top, *loc[1:]])
            raise InvalidRequest(f"{where}: {error['msg']}", param=top) from exc

    def plan(
        self,
        tools: Sequence[ToolSpec],
        tool_choice: ToolChoice | None,
        parallel_tool_calls: bool | None,
        fields: ToolFields,
        constraint: Constraint | None,
        template_kwargs: Mapping[str, object],
    ) -> ToolPlan:
        if not tools and tool_choice in (None, "none") and not self._reasoning:
            return ToolPlan()  # nothing to read back: no request model to build
        request = self._request(tools, tool_choice, parallel_tool_calls, fields, constraint)
        # The tools as vLLM's validated model renders them into the chat template (its
        # defaults included), so the prompt is `vllm serve`'s, token for token.
        template_tools = tuple(tool.model_dump() for tool in request.tools or ()) or None
        choice = request.tool_choice
        if choice not in (None, "none") and not self._reads_calls:
            if choice == "auto":
                raise InvalidRequest(
                    '"auto" tool choice requires --enable-auto-tool-choice and '
                    "--tool-call-parser to be set",
                    param=fields.tool_choice,
                )
            raise InvalidRequest(
                "tool_choice other than none requires --tool-call-parser to be set",
                param=fields.tool_choice,
            )
        parser_cls = self._parser_cls
        if parser_cls is None or (choice in (None, "none") and not self._reasoning):
            return ToolPlan(template_tools=template_tools)
        # As vLLM's chat serving builds its parser: the request's template switches reach
        # parsers that read them (a reasoning parser's thinking toggle).
        kwargs = {"model_config": self._model_config, "chat_template_kwargs": dict(template_kwargs)}
        adjusted = parser_cls(self._tokenizer, request.tools, **kwargs).adjust_request(
            request.model_copy(deep=True)
        )

        def new_parser() -> _Parser:
            return _Parser(parser_cls(self._tokenizer, adjusted.tools, **kwargs), adjusted)

        forced = None
        outputs = adjusted.structured_outputs
        if outputs is not None and not _unchanged(outputs, constraint):
            forced = forced_call(outputs, self._grammar_config, fields.tool_choice)
        return ToolPlan(
            forced,
            new_parser,
            skip_special_tokens=adjusted.skip_special_tokens,
            template_tools=template_tools,
        )
