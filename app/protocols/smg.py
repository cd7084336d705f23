"""SMG's gRPC worker protocol (smg-grpc-proto's `vllm.grpc.engine.VllmEngine`), sans-IO:
a `GenerateRequest` -> the engine requests it makes, and their events -> the
`GenerateResponse`s SMG reads, as vLLM's own servicer (smg-grpc-servicer, what `vllm
serve --grpc` runs) answers them.

In SMG's gRPC mode the router tokenizes, renders chat templates, parses tool calls and
reasoning, and matches stop strings itself; the worker moves token ids only:

- In: the prompt's token ids (`tokenized.input_ids`; a `text` prompt is tokenized here,
  as the servicer hands text to vLLM to tokenize), the sampling parameters as vLLM names
  them (unset proto3 scalars read as the model's defaults: temperature when absent, a
  top_p or repetition_penalty of 0), `n` choices (choice i seeded with seed + i), one
  structured-output constraint (json_schema, regex, grammar, structural_tag for a forced
  tool call, json_object, choice), `truncate_prompt_tokens` (the prompt's last k tokens;
  -1: the context). Checked by `app.engine.validation` (a bad value is INVALID_ARGUMENT
  naming `sampling_params.<field>`). Multimodal inputs, media references and KV-transfer
  parameters (SMG's vision and disaggregated modes) are refused: this worker serves
  neither. The engine detokenizes only to match stop strings (as the servicer asks
  vLLM: `detokenize` only with `stop`).
- Out, streamed: per choice, `GenerateStreamChunk`s of delta token ids (what arrived
  since the last message: the transport may send several engine steps in one), with
  `prompt_tokens`, `cached_tokens`, the delta's `completion_tokens`, its output logprobs
  when asked, the prompt's logprobs on the first chunk; then a `GenerateComplete` with
  the finish reason ("stop", "length", "abort"), the matched stop (token id or string)
  and the usage counts. SMG accumulates a vLLM worker's chunks (delta semantics) and
  reads only the metadata of a streamed Complete, so its `output_ids` stay empty.
  Not streamed: one Complete per choice once it ends, with every token and logprob.

Invariant: each choice's messages are made from its own events in order; exactly one
Complete per choice, after its last chunk.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from app.engine.base import (
    EngineInfo,
    GenerationRequest,
    SamplingOptions,
    TokenEvent,
    Tokenizer,
    TokenLogprob,
)
from app.engine.constraints import Constraint, ConstraintKind, json_constraint
from app.engine.validation import check_prompt, validate_sampling
from app.errors import InvalidRequest

_PARAMS = "sampling_params"
FIELDS = {
    name: f"{_PARAMS}.{name}"
    for name in (
        "seed",
        "temperature",
        "n",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "max_tokens",
        "min_tokens",
        "stop",
        "stop_token_ids",
        "logprobs",
        "prompt_logprobs",
        "logit_bias",
    )
} | {"prompt": "tokenized.input_ids"}

# The proto's constraint oneof -> the seam's kinds (json_object and choice apart).
_KINDS: dict[str, ConstraintKind] = {
    "regex": "regex",
    "grammar": "grammar",
    "structural_tag": "structural_tag",
}


def _constraint(params: pb.SamplingParams) -> Constraint | None:
    which = params.WhichOneof("constraint")
    if which is None:
        return None
    param = f"{_PARAMS}.{which}"
    if which == "json_schema":
        return json_constraint(params.json_schema, param)
    if which == "json_object":
        return Constraint("json_object", None, param) if params.json_object else None
    if which == "choice":
        return Constraint("choice", tuple(params.choice.choices), param)
    return Constraint(_KINDS[which], getattr(params, which), param)


def _prompt(request: pb.GenerateRequest, info: EngineInfo, tokenizer: Tokenizer) -> list[int]:
    for unsupported, what in (
        ("mm_inputs", "multimodal inputs"),
        ("media_refs", "media references"),
        ("kv_transfer_params", "KV-transfer parameters"),
    ):
        if request.HasField(unsupported):
            raise InvalidRequest(f"this worker takes no {what}", param=unsupported)
    if request.extra_mm_inputs:
        raise InvalidRequest("this worker takes no multimodal inputs", param="extra_mm_inputs")
    if request.HasField("kv_transfer_params_json"):
        raise InvalidRequest(
            "this worker takes no KV-transfer parameters", param="kv_transfer_params_json"
        )
    which = request.WhichOneof("input")
    if which == "tokenized":
        ids = list(request.tokenized.input_ids)
    elif which == "text":
        ids = tokenizer.encode(request.text)
    else:
        raise InvalidRequest("a GenerateRequest needs tokenized input or text", param="input")
    params = request.sampling_params
    if params.HasField("truncate_prompt_tokens"):
        keep = params.truncate_prompt_tokens
        if keep == -1:
            keep = info.max_model_len
        if keep < 1:
            raise InvalidRequest(
                f"{_PARAMS}.truncate_prompt_tokens must be -1 or at least 1, got "
                f"{params.truncate_prompt_tokens}",
                param=f"{_PARAMS}.truncate_prompt_tokens",
            )
        ids = ids[-keep:]
    return ids


def sampling_options(
    params: pb.SamplingParams, info: EngineInfo, prompt_len: int, n: int
) -> SamplingOptions:
    """The proto's sampling parameters with the model's defaults where it says nothing,
    checked (`app.engine.validation`)."""
    defaults = info.sampling_defaults
    if params.HasField("max_tokens"):
        max_tokens = params.max_tokens
    else:  # the rest of the context, or the model's own bound
        rest = max(info.max_model_len - prompt_len, 1)
        max_tokens = rest if defaults.max_tokens is None else min(defaults.max_tokens, rest)
    stop = tuple(params.stop)
    options = SamplingOptions(
        max_tokens=max_tokens,
        temperature=params.temperature if params.HasField("temperature") else defaults.temperature,
        top_p=params.top_p or defaults.top_p,
        top_k=params.top_k or defaults.top_k,
        min_p=params.min_p,
        seed=params.seed if params.HasField("seed") else None,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty or defaults.repetition_penalty,
        stop=stop,
        stop_token_ids=tuple(params.stop_token_ids),
        include_stop_str_in_output=params.include_stop_str_in_output,
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        logprobs=params.logprobs if params.HasField("logprobs") else None,
        prompt_logprobs=params.prompt_logprobs if params.HasField("prompt_logprobs") else None,
        skip_special_tokens=params.skip_special_tokens,
        constraint=_constraint(params),
        logit_bias=tuple(sorted(params.logit_bias.items())),
        detokenize=bool(stop),
    )
    return validate_sampling(options, info, FIELDS, n=n)


def output_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[TokenLogprob], top: bool
) -> pb.OutputLogProbs:
    out = pb.OutputLogProbs(token_ids=token_ids, token_logprobs=[lp.logprob for lp in logprobs])
    if top:
        out.top_logprobs.extend(
            pb.TopLogProbs(token_ids=list(lp.top), values=list(lp.top.values())) for lp in logprobs
        )
    return out


def input_logprobs(
    prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None], top: bool
) -> pb.InputLogProbs:
    out = pb.InputLogProbs(token_ids=prompt_ids)
    for lp in logprobs:
        out.token_logprobs.append(
            pb.InputTokenLogProb() if lp is None else pb.InputTokenLogProb(value=lp.logprob)
        )
        if top:
            out.top_logprobs.append(
                pb.TopLogProbs()
                if lp is None
                else pb.TopLogProbs(token_ids=list(lp.top), values=list(lp.top.values()))
            )
    return out


@dataclass(slots=True)
class _Choice:
    """What one choice has produced: counts, and (not streamed) everything."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    first: bool = True
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_ids: Sequence[int] = ()
    prompt_logprobs: Sequence[TokenLogprob | None] | None = None


class SmgGenerate:
    """One `Generate` call: its engine requests (one per choice) and its messages."""

    def __init__(self, request: pb.GenerateRequest, info: EngineInfo, tokenizer: Tokenizer):
        params = request.sampling_params
        n = params.n or 1
        prompt = _prompt(request, info, tokenizer)
        options = sampling_options(params, info, len(prompt), n)
        check_prompt(prompt, options.max_tokens, info, FIELDS)
        self.name = request.request_id
        self.stream = request.stream
        self._top = bool(options.logprobs)
        self._prompt_top = bool(options.prompt_logprobs)
        self._logprobs = options.logprobs is not None
        self._prompt_logprobs = options.prompt_logprobs is not None
        tag = uuid.uuid4().hex[:12]
        self.requests = tuple(
            GenerationRequest(
                request_id=f"smg-{tag}-{i}",
                prompt_token_ids=prompt,
                sampling=options
                if options.seed is None or i == 0
                else replace(options, seed=options.seed + i),
            )
            for i in range(n)
        )
        self._choices = [_Choice() for _ in range(n)]

    def messages(self, index: int, events: Iterable[TokenEvent]) -> list[pb.GenerateResponse]:
        """What to send for choice `index`'s events since the last call (streamed: one
        chunk for them all, and the Complete if the last one ends the choice; not
        streamed: the Complete once the choice ends, else nothing)."""
        choice = self._choices[index]
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        finished: TokenEvent | None = None
        first = choice.first
        for event in events:
            if event.prompt_token_ids is not None:
                choice.prompt_tokens = len(event.prompt_token_ids)
                choice.cached_tokens = event.num_cached_tokens
                choice.prompt_ids = event.prompt_token_ids
                choice.prompt_logprobs = event.prompt_logprobs
            tokens.extend(event.token_ids)
            if event.logprobs is not None:
                logprobs.extend(event.logprobs)
            if event.finish_reason is not None:
                finished = event
        choice.completion_tokens += len(tokens)
        out: list[pb.GenerateResponse] = []
        if self.stream:
            if tokens or first:
                out.append(pb.GenerateResponse(chunk=self._chunk(index, choice, tokens, logprobs)))
                choice.first = False
        else:
            choice.token_ids.extend(tokens)
            choice.logprobs.extend(logprobs)
        if finished is not None:
            out.append(pb.GenerateResponse(complete=self._complete(index, choice, finished)))
        return out

    def _chunk(
        self, index: int, choice: _Choice, tokens: list[int], logprobs: list[TokenLogprob]
    ) -> pb.GenerateStreamChunk:
        chunk = pb.GenerateStreamChunk(
            token_ids=tokens,
            prompt_tokens=choice.prompt_tokens,
            completion_tokens=len(tokens),
            cached_tokens=choice.cached_tokens,
            index=index,
        )
        if self._logprobs and tokens:
            chunk.output_logprobs.CopyFrom(output_logprobs(tokens, logprobs, self._top))
        if choice.first and self._prompt_logprobs and choice.prompt_logprobs is not None:
            chunk.input_logprobs.CopyFrom(
                input_logprobs(choice.prompt_ids, choice.prompt_logprobs, self._prompt_top)
            )
        return chunk

    def _complete(self, index: int, choice: _Choice, last: TokenEvent) -> pb.GenerateComplete:
        complete = pb.GenerateComplete(
            finish_reason=last.finish_reason or "stop",
            prompt_tokens=choice.prompt_tokens,
            completion_tokens=choice.completion_tokens,
            cached_tokens=choice.cached_tokens,
            index=index,
        )
        if isinstance(last.stop_reason, int):
            complete.matched_token_id = last.stop_reason
        elif isinstance(last.stop_reason, str):
            complete.matched_stop_str = last.stop_reason
        if not self.stream:
            complete.output_ids.extend(choice.token_ids)
            if self._logprobs and choice.token_ids:
                complete.output_logprobs.CopyFrom(
                    output_logprobs(choice.token_ids, choice.logprobs, self._top)
                )
            if self._prompt_logprobs and choice.prompt_logprobs is not None:
                complete.input_logprobs.CopyFrom(
                    input_logprobs(choice.prompt_ids, choice.prompt_logprobs, self._prompt_top)
                )
        return complete


def model_info(info: EngineInfo, config: dict[str, object]) -> pb.GetModelInfoResponse:
    """`GetModelInfo`: the served model's facts (`config`: its config.json)."""
    defaults = info.sampling_defaults
    advertised = {
        "temperature": defaults.temperature,
        "top_p": defaults.top_p,
        "top_k": defaults.top_k,
        "min_p": defaults.min_p,
        "repetition_penalty": defaults.repetition_penalty,
    }
    architectures = config.get("architectures")
    return pb.GetModelInfoResponse(
        model_path=info.model_path,
        is_generation=True,
        max_context_length=info.max_model_len,
        vocab_size=info.vocab_size,
        supports_vision=info.vision is not None,
        served_model_name=info.model_name,
        tokenizer_path=info.model_path,
        model_type=str(config.get("model_type") or ""),
        architectures=[str(a) for a in architectures] if isinstance(architectures, list) else [],
        eos_token_ids=list(info.eos_token_ids),
        pad_token_id=_int(config.get("pad_token_id")),
        bos_token_id=_int(config.get("bos_token_id")),
        max_req_input_len=info.max_model_len,
        default_sampling_params_json=json.dumps(advertised, separators=(",", ":")),
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
