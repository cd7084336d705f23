"""vLLM's token-in/token-out API (`POST /inference/v1/generate`, what llm-d's router
sends a model server after rendering a prompt with `/v1/*/render`), as an `Exchange`: the
body's token ids and vLLM-named sampling parameters -> engine requests; their events ->
vLLM 0.32's answer shapes (`vllm/entrypoints/scale_out/token_in_token_out`), the same
keys in the same places, so llm-d's client reads either server alike.

- In: `token_ids` (at least one, each in the vocabulary), `sampling_params` (vLLM's
  `SamplingParams` fields: an unknown one is refused, not ignored; `max_tokens` absent
  means the rest of the context, as vLLM's server defaults it; `structured_outputs` as
  everywhere, `app.engine.constraints.parse_constraint`), `n` choices (choice i seeded
  with seed + i), `stream` with `stream_options.include_usage`, `priority`,
  `return_token_ids`, `output_mode` ("tokens", or "text" for the text too),
  `request_id` (the name `/inference/v1/abort_requests` takes). Multimodal features,
  content parts and transfer parameters are refused: this server runs no disaggregated
  prefill, and its images come through the chat APIs.
- Out, not streamed: `{request_id, model, created, usage, output_mode, choices: [{index,
  finish_reason, stop_reason, token_ids, logprobs}], prompt_token_ids, ...}`; streamed:
  one `data:` chunk per choice per engine event (`{request_id, output_mode, choices:
  [{index, token_ids, finish_reason, stop_reason, logprobs, ...}], usage: null}`), the
  first with `prompt_token_ids` when asked, a usage chunk last when asked, then `[DONE]`.
- Logprobs as vLLM writes them here: per token `{token_id, logprob, rank, top_logprobs}`,
  the top list led by the sampled token and cut to max(k, 1), logprobs floored at
  -9999.0; in text mode, the chat shape with token strings and bytes.

The response's `request_id` is `generate-tokens-<the client's>`, as vLLM names it.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.engine.base import (
    EngineInfo,
    GenerationRequest,
    SamplingOptions,
    TokenEvent,
    Tokenizer,
    TokenLogprob,
)
from app.engine.constraints import logit_bias_pairs, parse_constraint
from app.engine.validation import check_prompt, validate_sampling
from app.errors import InvalidRequest, SwitchboardError
from app.protocols.accounting import Accounting
from app.protocols.exchange import Event
from app.protocols.openai.errors import error_body

_FLOOR = -9999.0
_UNSERVED = ("features", "content_parts", "kv_transfer_params", "ec_transfer_params")


class TokensSampling(BaseModel):
    """The `SamplingParams` fields this server takes (vLLM's names and defaults)."""

    model_config = ConfigDict(extra="forbid")

    # As Completions and Chat bound it (schemas.openai): admission lists a unit per choice
    # before anything runs, so n=10**12 was a MemoryError (a 500) on the event loop.
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    structured_outputs: dict[str, Any] | None = None


class TokensStreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class TokensRequest(BaseModel):
    """The body of `POST /inference/v1/generate`."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    token_ids: list[int] = Field(min_length=1)
    sampling_params: TokensSampling
    model: str | None = None
    stream: bool | None = False
    stream_options: TokensStreamOptions | None = None
    priority: int = 0
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    reasoning_ended: bool | None = None
    token_offsets: list[tuple[int, int]] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None


_FIELDS = {
    name: f"sampling_params.{name}"
    for name in TokensSampling.model_fields
    if name not in ("structured_outputs",)
} | {"prompt": "token_ids"}


def units(body: TokensRequest) -> list[int]:
    """Admission's units: one per choice, each the prompt's length."""
    return [len(body.token_ids)] * max(body.sampling_params.n, 1)


def sampling_options(body: TokensRequest, info: EngineInfo) -> SamplingOptions:
    params = body.sampling_params
    stop = (params.stop,) if isinstance(params.stop, str) else tuple(params.stop or ())
    if params.max_tokens is None:
        rest = max(info.max_model_len - len(body.token_ids), 1)
        bound = info.sampling_defaults.max_tokens
        max_tokens = rest if bound is None else min(bound, rest)
    else:
        max_tokens = params.max_tokens
    constraint = None
    if params.structured_outputs is not None:
        constraint = parse_constraint(
            params.structured_outputs, "sampling_params.structured_outputs"
        )
    if not params.detokenize and stop:
        raise InvalidRequest(
            "sampling_params.stop needs detokenize: stop strings are matched on text",
            param="sampling_params.stop",
        )
    options = SamplingOptions(
        max_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=None if params.seed == -1 else params.seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        stop=stop,
        stop_token_ids=tuple(params.stop_token_ids or ()),
        include_stop_str_in_output=params.include_stop_str_in_output,
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
        skip_special_tokens=params.skip_special_tokens,
        constraint=constraint,
        logit_bias=logit_bias_pairs(params.logit_bias or {}, "sampling_params.logit_bias"),
        detokenize=body.output_mode == "text" and params.detokenize,
    )
    return validate_sampling(options, info, _FIELDS, n=params.n)


def _floor(value: float) -> float:
    return _FLOOR if math.isnan(value) else max(value, _FLOOR)


class TokensExchange:
    """One `/inference/v1/generate` call."""

    ends_with_done = True

    def __init__(
        self, body: TokensRequest, info: EngineInfo, tokenizer: Tokenizer, *, model: str
    ) -> None:
        for unsupported in (
            "features",
            "content_parts",
            "kv_transfer_params",
            "ec_transfer_params",
        ):
            if getattr(body, unsupported) is not None:
                raise InvalidRequest(
                    f"{unsupported} is not served here: no disaggregated prefill, and "
                    "images go through the chat APIs",
                    param=unsupported,
                )
        if body.output_mode == "text" and not body.sampling_params.detokenize:
            raise InvalidRequest(
                "output_mode='text' requires sampling_params.detokenize to be true",
                param="output_mode",
            )
        n = body.sampling_params.n
        options = sampling_options(body, info)
        check_prompt(body.token_ids, options.max_tokens, info, _FIELDS)
        self.body = body
        self.name = body.request_id
        self.response_id = f"generate-tokens-{body.request_id}"
        self.model = model
        self.created = int(time.time())
        self._tokenizer = tokenizer
        self._text = body.output_mode == "text"
        self._k = options.logprobs
        opts = body.stream_options
        self._include_usage = bool(body.stream and opts is not None and opts.include_usage)
        self._continuous = bool(
            self._include_usage and opts is not None and opts.continuous_usage_stats
        )
        tag = uuid.uuid4().hex[:12]
        self._requests = [
            GenerationRequest(
                request_id=f"tokens-{tag}-{i}",
                prompt_token_ids=body.token_ids,
                sampling=options
                if options.seed is None or i == 0
                else replace(options, seed=options.seed + i),
                priority=body.priority,
            )
            for i in range(n)
        ]
        self.accounting = Accounting([0] * n)
        self._prompt_ids_pending = bool(body.return_token_ids)
        self._choices: list[dict[str, Any]] = [self._choice(i) for i in range(n)]
        self._prompt_logprobs: Sequence[TokenLogprob | None] | None = None

    @property
    def requests(self) -> Sequence[GenerationRequest]:
        return self._requests

    # -- pieces -----------------------------------------------------------------------

    def _choice(self, index: int) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": index,
            "finish_reason": None,
            "stop_reason": None,
            "token_ids": [],
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
            "logprobs": None if self._k is None else {"content": []},
        }
        if self._text:
            choice["text"] = ""
        return choice

    def _logprobs(self, ids: Sequence[int], logprobs: Sequence[TokenLogprob]) -> list[Any]:
        k = max(self._k or 0, 1)
        out = []
        for token_id, lp in zip(ids, logprobs, strict=False):
            entries = [(token_id, lp.logprob, lp.rank)]
            entries += [(t, v, r) for r, (t, v) in enumerate(lp.top.items(), 1) if t != token_id]
            entries = entries[:k]
            if self._text:
                out.append(
                    {
                        **self._token(token_id, lp.logprob),
                        "top_logprobs": [self._token(t, v) for t, v, _ in entries],
                    }
                )
            else:
                out.append(
                    {
                        "token_id": token_id,
                        "logprob": _floor(lp.logprob),
                        "rank": lp.rank or None,
                        "top_logprobs": [
                            {"token_id": t, "logprob": _floor(v), "rank": r or None}
                            for t, v, r in entries
                        ],
                    }
                )
        return out

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return {
            "token": text,
            "logprob": _floor(logprob),
            "bytes": list(text.encode("utf-8", errors="replace")),
        }

    def _usage(self, index: int | None = None) -> dict[str, Any]:
        usage = self.accounting.usage()
        completion = (
            usage.completion_tokens
            if index is None
            else self.accounting.states[index].completion_tokens
        )
        return {
            "prompt_tokens": usage.prompt_tokens,
            "total_tokens": usage.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    # -- streamed ---------------------------------------------------------------------

    def opening(self) -> list[Event]:
        return []

    def events(self, index: int, event: TokenEvent) -> list[Event]:
        self.accounting.account(index, event)
        if not event.token_ids and event.finish_reason is None and not (self._text and event.text):
            return []
        choice: dict[str, Any] = {
            "index": index,
            "finish_reason": event.finish_reason,
            "stop_reason": event.stop_reason,
            "token_ids": list(event.token_ids),
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
            "logprobs": None
            if self._k is None
            else {"content": self._logprobs(event.token_ids, event.logprobs or ())},
        }
        if self._text:
            choice["text"] = event.text
        chunk: dict[str, Any] = {
            "request_id": self.response_id,
            "usage": self._usage(index) if self._continuous else None,
            "output_mode": self.body.output_mode,
            "choices": [choice],
        }
        if self._prompt_ids_pending and event.prompt_token_ids is not None:
            chunk["prompt_token_ids"] = list(event.prompt_token_ids)
            chunk["mm_placeholders"] = None
            self._prompt_ids_pending = False
        return [(None, chunk)]

    def closing(self) -> list[Event]:
        if not self._include_usage:
            return []
        return [
            (
                None,
                {
                    "request_id": self.response_id,
                    "usage": {k: v for k, v in self._usage().items() if v is not None},
                    "output_mode": self.body.output_mode,
                    "choices": [],
                },
            )
        ]

    def failure(self, error: SwitchboardError) -> list[Event]:
        return [(None, error_body(error))]

    # -- not streamed -----------------------------------------------------------------

    def feed(self, index: int, event: TokenEvent) -> None:
        self.accounting.account(index, event)
        choice = self._choices[index]
        choice["token_ids"].extend(event.token_ids)
        if self._text:
            choice["text"] += event.text
        if self._k is not None:
            choice["logprobs"]["content"].extend(
                self._logprobs(event.token_ids, event.logprobs or ())
            )
        if event.prompt_logprobs is not None:
            self._prompt_logprobs = event.prompt_logprobs
        if event.finish_reason is not None:
            choice["finish_reason"] = event.finish_reason
            choice["stop_reason"] = event.stop_reason
        if event.prompt_token_ids is not None and self.body.return_token_ids:
            self._prompt_ids = list(event.prompt_token_ids)

    def result(self) -> dict[str, Any]:
        return {
            "request_id": self.response_id,
            "model": self.model,
            "created": self.created,
            "usage": self._usage(),
            "prompt_logprobs": self._prompt_logprobs_body(),
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": list(self.body.token_ids) if self.body.return_token_ids else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": self.body.output_mode,
            "choices": self._choices,
        }

    def _prompt_logprobs_body(self) -> list[Any] | None:
        """vLLM's `prompt_logprobs`: per prompt position None (the first) or
        `{token id: {logprob, rank, decoded_token}}`."""
        if self._prompt_logprobs is None:
            return None
        out: list[Any] = []
        for position in self._prompt_logprobs:
            if position is None:
                out.append(None)
                continue
            entries = {position.token_id: (position.logprob, position.rank)}
            for rank, (t, v) in enumerate(position.top.items(), 1):
                entries.setdefault(t, (v, rank))
            out.append(
                {
                    str(t): {"logprob": _floor(v), "rank": r, "decoded_token": None}
                    for t, (v, r) in entries.items()
                }
            )
        return out
