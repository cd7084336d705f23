"""POST /v1/completions/render and /v1/chat/completions/render (what llm-d's router
calls to tokenize, as `vllm serve --enable-scale-out` answers): the request is validated
and tokenized exactly as for generation (the same exchange builds it), and answered with
what would be handed to the engine: a chat body gives one generate request, a
completions body a list, one per prompt.

Each item has vLLM's `GenerateRequest` shape, its keys in vLLM's order (checked against
vLLM's own render server by tests/e2e/test_render_peer.py): `request_id` (a completions
body with one prompt gets the bare id, several get `-<index>` suffixes, as vLLM does),
`token_ids`, `token_offsets`, `features`, `content_parts` (null: no offsets asked, no
multimodal), `sampling_params` (vLLM's field names), `model`, `reasoning_ended`,
`reasoning_parser_kwargs` (null: no reasoning parser), `return_token_ids`, `output_mode`
(`tokens`), `stream`, `stream_options`, `cache_salt`, `priority`, `kv_transfer_params`,
`ec_transfer_params` (null: no disaggregation).
"""

from __future__ import annotations

from typing import Any

from app.engine.base import GenerationRequest, SamplingOptions
from app.protocols.openai.chat import ChatExchange
from app.protocols.openai.completions import CompletionExchange


def _sampling(options: SamplingOptions, n: int) -> dict[str, Any]:
    return {
        "n": n,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": options.top_k,  # 0: all tokens, as vLLM writes it (it reads -1 as 0)
        "min_p": options.min_p,
        "seed": options.seed,
        "presence_penalty": options.presence_penalty,
        "frequency_penalty": options.frequency_penalty,
        "repetition_penalty": options.repetition_penalty,
        "stop": list(options.stop),
        "stop_token_ids": list(options.stop_token_ids),
        "include_stop_str_in_output": options.include_stop_str_in_output,
        "ignore_eos": options.ignore_eos,
        "min_tokens": options.min_tokens,
        "logprobs": options.logprobs,
        "prompt_logprobs": options.prompt_logprobs,
        "skip_special_tokens": options.skip_special_tokens,
        "logit_bias": {str(t): b for t, b in options.logit_bias} or None,
        "structured_outputs": (
            {options.constraint.kind: options.constraint.spec}
            if options.constraint is not None
            else None
        ),
    }


def _item(
    exchange: ChatExchange | CompletionExchange, request: GenerationRequest, request_id: str
) -> dict[str, Any]:
    body = exchange.body
    return {
        "request_id": request_id,
        "token_ids": list(request.prompt_token_ids or ()),
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": _sampling(request.sampling, body.n),
        "model": exchange.model,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": body.stream,
        "stream_options": body.stream_options.model_dump()
        if body.stream and body.stream_options
        else None,
        "cache_salt": None,
        "priority": request.priority,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


def render_chat(exchange: ChatExchange) -> dict[str, Any]:
    return _item(exchange, exchange.plans[0].request, exchange.response_id)


def render_completions(exchange: CompletionExchange) -> list[dict[str, Any]]:
    """One item per prompt (the first choice's request carries its options)."""
    firsts: dict[int, GenerationRequest] = {}
    for plan in exchange.plans:
        firsts.setdefault(plan.prompt_index, plan.request)
    if len(firsts) == 1:
        return [_item(exchange, next(iter(firsts.values())), exchange.response_id)]
    return [
        _item(exchange, request, f"{exchange.response_id}-{index}")
        for index, request in sorted(firsts.items())
    ]
