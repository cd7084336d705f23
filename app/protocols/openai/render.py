"""POST /v1/completions/render and /v1/chat/completions/render (what llm-d's router
calls to tokenize, as `vllm serve --enable-scale-out` answers): the request is validated
and tokenized exactly as for generation (the same core builds it), and answered with
what would be handed to the engine: a chat body gives one generate request, a
completions body a list, one per prompt.

Each item has vLLM's `GenerateRequest` shape: `request_id`, `token_ids`, `features`
(null: no multimodal), `sampling_params` (vLLM's field names), `model`, `stream`,
`stream_options`, `cache_salt`, `priority`.
"""

from __future__ import annotations

from typing import Any

from app.engine.base import GenerationRequest, SamplingOptions
from app.protocols.openai.chat import ChatCore
from app.protocols.openai.completions import CompletionCore


def _sampling(options: SamplingOptions, n: int) -> dict[str, Any]:
    return {
        "n": n,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": options.top_k if options.top_k else -1,
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
    core: ChatCore | CompletionCore, request: GenerationRequest, request_id: str
) -> dict[str, Any]:
    body = core.body
    return {
        "request_id": request_id,
        "token_ids": list(request.prompt_token_ids or ()),
        "features": None,
        "sampling_params": _sampling(request.sampling, body.n),
        "model": core.model,
        "stream": body.stream,
        "stream_options": body.stream_options.model_dump()
        if body.stream and body.stream_options
        else None,
        "cache_salt": None,
        "priority": request.priority,
    }


def render_chat(core: ChatCore) -> dict[str, Any]:
    return _item(core, core.plans[0].request, core.response_id)


def render_completions(core: CompletionCore) -> list[dict[str, Any]]:
    """One item per prompt (the first choice's request carries its options)."""
    firsts: dict[int, GenerationRequest] = {}
    for plan in core.plans:
        firsts.setdefault(plan.prompt_index, plan.request)
    return [
        _item(core, request, f"{core.response_id}-{index}")
        for index, request in sorted(firsts.items())
    ]
