"""One `InferCall` against the language model: input tensors -> engine requests, engine
events -> output tensors.

`admission_units(call)` is what the call asks admission for, read from the input tensor
alone (its type and shape checked, nothing tokenized, no list of ids built): one unit per
prompt, each with a bound of its tokens. Then `InferExchange(call, info, tokenizer, ...)`,
blocking work for the prompt thread, validates everything the model needs (which input,
every token id, the outputs asked for, the config and its constraint, which the engine's
backend compiles), tokenizes text prompts and checks every prompt's fit, before any
engine request exists; the first problem raises `InvalidRequest`
(`ContextLengthExceeded` for a prompt that cannot fit). Limits and the prompt's fit are
`app.engine.validation`'s, with the config's field names. Then `requests` holds one
`GenerationRequest` per prompt, token ids only, in batch order; the caller runs them,
passes every event to `feed(index, event)`, and takes `outputs()`: one array per output
name, in the order asked for.

Every prompt of a batch samples with the same options, seed included, so a prompt's
output does not depend on its position in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.admission import text_tokens_bound
from app.engine.base import EngineInfo, GenerationRequest, SamplingOptions, TokenEvent, Tokenizer
from app.engine.validation import check_fit, check_prompt, validate_sampling
from app.errors import InvalidRequest
from app.protocols.accounting import Accounting
from app.protocols.graphpipe.config import NAMES, InferConfig, parse_config
from app.protocols.graphpipe.decode import InferCall
from app.protocols.graphpipe.model import (
    INPUT_NAMES,
    LOGPROBS,
    OUTPUT_NAMES,
    PROMPT,
    PROMPT_IDS,
    TEXT,
    TOKEN_IDS,
)
from app.protocols.graphpipe.tensors import TensorType, type_of

PAD_ID = -1
_ID_DTYPES = (np.dtype("int32"), np.dtype("int64"))


def _input(call: InferCall) -> tuple[str, np.ndarray]:
    """The one input of `call` and its name."""
    tensors, names = call.inputs, call.input_names
    if not tensors:
        raise InvalidRequest(
            f"The request has no input tensor; send one: `{PROMPT}` (String [n]) "
            f"or `{PROMPT_IDS}` (Int64 or Int32 [n, m])",
            param="input_tensors",
        )
    if names and len(names) != len(tensors):
        raise InvalidRequest(
            f"input_names has {len(names)} names for {len(tensors)} input tensors; "
            "the spec requires one name per tensor",
            param="input_names",
        )
    for name in names:
        if name not in INPUT_NAMES:
            raise InvalidRequest(
                f"Unknown input `{name}`; this model's inputs are `{PROMPT}` and `{PROMPT_IDS}`",
                param="input_names",
            )
    if len(tensors) > 1:
        raise InvalidRequest(
            f"Send exactly one input tensor, `{PROMPT}` or `{PROMPT_IDS}`; got {len(tensors)}",
            param="input_tensors",
        )
    tensor = tensors[0]
    if names:
        return names[0], tensor
    return (PROMPT if type_of(tensor) is TensorType.String else PROMPT_IDS), tensor


def _check_prompts(tensor: np.ndarray) -> None:
    if type_of(tensor) is not TensorType.String:
        raise InvalidRequest(
            f"Input `{PROMPT}` must be a String tensor; got {type_of(tensor).name}",
            param=PROMPT,
        )
    if tensor.ndim != 1 or tensor.shape[0] == 0:
        raise InvalidRequest(
            f"Input `{PROMPT}` must have shape [n] with n >= 1; got {list(tensor.shape)}",
            param=PROMPT,
        )


def _prompts(tensor: np.ndarray) -> list[str]:
    prompts = []
    for i, raw in enumerate(tensor):
        try:
            prompts.append(bytes(raw).decode())
        except UnicodeDecodeError:
            raise InvalidRequest(f"{PROMPT}[{i}] is not valid UTF-8", param=PROMPT) from None
    return prompts


def _id_lengths(tensor: np.ndarray) -> np.ndarray:
    """How many token ids each row holds before its padding (numpy only: no list is
    built); the ids themselves are checked with the prompt."""
    if tensor.dtype not in _ID_DTYPES:
        raise InvalidRequest(
            f"Input `{PROMPT_IDS}` must be an Int64 or Int32 tensor; got {type_of(tensor).name}",
            param=PROMPT_IDS,
        )
    if tensor.ndim != 2 or 0 in tensor.shape:
        raise InvalidRequest(
            f"Input `{PROMPT_IDS}` must have shape [n, m] with n, m >= 1; got {list(tensor.shape)}",
            param=PROMPT_IDS,
        )
    ids = tensor.astype(np.int64, copy=False)
    pad = ids == PAD_ID
    # Padding is a suffix: once a row has a pad, everything after it must be a pad too.
    misplaced = pad & ~np.logical_and.accumulate(pad[:, ::-1], axis=1)[:, ::-1]
    if misplaced.any():
        row, col = (int(x) for x in np.argwhere(misplaced)[0])
        raise InvalidRequest(
            f"{PROMPT_IDS}[{row}] has padding ({PAD_ID}) at {col} before a token id; "
            "rows are right-padded",
            param=PROMPT_IDS,
        )
    lengths: np.ndarray = (~pad).sum(axis=1)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise InvalidRequest(f"{PROMPT_IDS}[{int(empty[0])}] has no token ids", param=PROMPT_IDS)
    return lengths


def admission_units(call: InferCall) -> list[int]:
    """One unit per prompt of the batch, each a bound of its tokens (`app.admission`):
    a text prompt's UTF-8 length (with the tokenizer's allowance), a row's ids."""
    name, tensor = _input(call)
    if name == PROMPT:
        _check_prompts(tensor)
        return [text_tokens_bound(bytes(raw)) for raw in tensor]
    return [int(n) for n in _id_lengths(tensor)]


def _outputs(names: Sequence[str], config: InferConfig) -> tuple[str, ...]:
    for name in names:
        if name not in OUTPUT_NAMES:
            raise InvalidRequest(
                f"Unknown output `{name}`; this model's outputs are "
                + ", ".join(f"`{o}`" for o in OUTPUT_NAMES),
                param="output_names",
            )
    if names:
        return tuple(names)
    return (TEXT, LOGPROBS) if config.logprobs else (TEXT,)


class InferExchange:
    def __init__(
        self,
        call: InferCall,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        request_id: str,
        lora_name: str | None,
    ) -> None:
        name, tensor = _input(call)
        config = parse_config(call.config)
        self.output_names = _outputs(call.output_names, config)
        options = SamplingOptions(
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            seed=config.seed,
            stop=config.stop,
            logprobs=0 if LOGPROBS in self.output_names else None,
            constraint=config.constraint,
        )
        sampling = validate_sampling(options, info, NAMES)

        if name == PROMPT:
            _check_prompts(tensor)
            rows = [tokenizer.encode(text) for text in _prompts(tensor)]
            input_name = PROMPT
        else:
            lengths = _id_lengths(tensor)
            ids = tensor.astype(np.int64, copy=False)
            for i, n in enumerate(lengths):
                # A row that cannot fit is refused before its ids become a list.
                check_fit(int(n), sampling.max_tokens, info, self._names(PROMPT_IDS, i))
            rows = [ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]
            input_name = PROMPT_IDS
        for i, row in enumerate(rows):
            check_prompt(row, sampling.max_tokens, info, self._names(input_name, i))
        self.requests = tuple(
            GenerationRequest(
                request_id=f"{request_id}-{i}",
                prompt_token_ids=row,
                sampling=sampling,
                lora_name=lora_name,
            )
            for i, row in enumerate(rows)
        )
        self.accounting = Accounting(range(len(self.requests)))
        self._tokens: list[list[int]] = [[] for _ in self.requests]
        self._texts: list[list[str]] = [[] for _ in self.requests]
        self._logprobs: list[list[float]] = [[] for _ in self.requests]

    @staticmethod
    def _names(input_name: str, row: int) -> dict[str, str]:
        return {**NAMES, "prompt": f"{input_name}[{row}]"}

    def feed(self, index: int, event: TokenEvent) -> None:
        self.accounting.account(index, event)
        self._tokens[index].extend(event.token_ids)
        self._texts[index].append(event.text)
        if event.logprobs is not None:
            self._logprobs[index].extend(lp.logprob for lp in event.logprobs)

    def outputs(self) -> list[np.ndarray]:
        return [self._output(name) for name in self.output_names]

    def _output(self, name: str) -> np.ndarray:
        if name == TEXT:
            text = np.empty(len(self._texts), dtype=object)
            text[:] = ["".join(parts).encode() for parts in self._texts]
            return text
        rows: Sequence[Sequence[float]] = self._tokens if name == TOKEN_IDS else self._logprobs
        width = max((len(r) for r in rows), default=0)
        if name == TOKEN_IDS:
            array = np.full((len(rows), width), PAD_ID, dtype=np.int64)
        else:
            array = np.full((len(rows), width), np.nan, dtype=np.float32)
        for i, row in enumerate(rows):
            array[i, : len(row)] = row
        return array
