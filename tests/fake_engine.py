"""A deterministic fake of `app.engine.base.Engine`, for fast unit tests of routes and
cores. Never the only proof: every surface also has engine and e2e tests on real vLLM.

The fake "tokenizer" maps each character to its code point (ids < 256) and the model
continues a prompt with ids (last + 1) % 256, one per step, yielding control between
tokens so that cancellation and concurrency behave as with the real engine.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from app.engine.base import (
    ChatPrompt,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    LoraAdapter,
    TokenEvent,
    TokenLogprob,
)
from app.engine.constraints import Constraint
from app.engine.validation import check_prompt, validate_sampling
from app.errors import InvalidRequest, ModelNotFound, NotFound

EOS = 0


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [min(ord(c), 255) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids if not (skip_special_tokens and t == EOS))

    def apply_chat_template(self, prompt: ChatPrompt) -> list[int]:
        text = "".join(f"[{m.role}]{m.text()}\n" for m in prompt.messages)
        if prompt.add_generation_prompt:
            text += "[assistant]"
        return self.encode(text)

    def token_to_str(self, token_id: int) -> str:
        return chr(token_id)


def _logprob(token_id: int, k: int) -> TokenLogprob:
    top = {(token_id + i) % 256: -math.log(2.0) * (i + 1) for i in range(k)}
    return TokenLogprob(token_id=token_id, logprob=-math.log(2.0), rank=1, top=top)


def _check_constraint(constraint: Constraint) -> None:
    """The fake's structured-output backend compiles anything but a marked spec."""
    if isinstance(constraint.spec, str) and "UNCOMPILABLE" in constraint.spec:
        raise InvalidRequest("cannot compile", param=constraint.param)


class FakeEngine:
    def __init__(self, max_model_len: int = 512, step_delay: float = 0.0) -> None:
        self._info = EngineInfo(
            model_name="fake",
            model_path="/nonexistent/fake",
            max_model_len=max_model_len,
            vocab_size=256,
            eos_token_ids=(EOS,),
            has_chat_template=True,
            max_loras=2,
            check_constraint=_check_constraint,
        )
        self._tokenizer = FakeTokenizer()
        self._loras: dict[str, LoraAdapter] = {}
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.requests: list[GenerationRequest] = []
        self.step_delay = step_delay
        # KV-event publishers by rank, as vLLM reports its config (tests set them).
        self.kv_sources: dict[int, dict[str, object]] = {}

    @property
    def info(self) -> EngineInfo:
        return self._info

    @info.setter
    def info(self, info: EngineInfo) -> None:
        self._info = info

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self._tokenizer

    def has_model(self, name: str) -> bool:
        return name == self._info.model_name or name in self._loras

    def loras(self) -> Sequence[LoraAdapter]:
        return list(self._loras.values())

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        adapter = LoraAdapter(name=name, path=path, int_id=len(self._loras) + 1)
        self._loras[name] = adapter
        return adapter

    async def unload_lora(self, name: str) -> None:
        if self._loras.pop(name, None) is None:
            raise NotFound(f"LoRA adapter {name!r} is not loaded")

    def num_running_requests(self) -> int:
        return len(self.running)

    def engine_requests(self) -> int:
        return len(self.running)

    def kv_event_sources(self) -> dict[int, dict[str, object]]:
        return self.kv_sources

    async def check_health(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        # As vLLM: a running request's stream ends with a final `abort` event.
        self.aborted.append(request_id)
        self.running.discard(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        if request.lora_name is not None and request.lora_name not in self._loras:
            raise ModelNotFound(f"The model `{request.lora_name}` does not exist.")
        prompt = list(
            request.prompt_token_ids
            if request.prompt_token_ids is not None
            else self._tokenizer.encode(request.prompt_text or "")
        )
        # The real engine's safety net, so a core that skipped a check fails here too.
        sampling = validate_sampling(
            request.sampling, self._info, prefill_only=True, compile_constraint=False
        )
        check_prompt(prompt, sampling.max_tokens, self._info)
        self.requests.append(request)
        self.running.add(request.request_id)
        k = sampling.logprobs
        pk = sampling.prompt_logprobs
        trace = request.trace
        if trace is not None:  # as vLLM's engine tells a traced request's stages
            trace.queued = trace.scheduled = time.monotonic()
        try:
            first = True
            last = prompt[-1] if prompt else 1
            if sampling.max_tokens == 0:
                yield TokenEvent(
                    token_ids=[],
                    text="",
                    finish_reason="length",
                    prompt_token_ids=prompt,
                    prompt_logprobs=self._prompt_logprobs(prompt, pk),
                )
                return
            for i in range(sampling.max_tokens):
                await asyncio.sleep(self.step_delay)
                if request.request_id in self.aborted:
                    yield TokenEvent(token_ids=[], text="", finish_reason="abort")
                    return
                token = (last + 1) % 256
                last = token
                done = i == sampling.max_tokens - 1 or token in sampling.stop_token_ids
                reason: FinishReason = "stop" if token in sampling.stop_token_ids else "length"
                yield TokenEvent(
                    token_ids=[token],
                    text=self._tokenizer.decode([token]),
                    logprobs=[_logprob(token, k)] if k is not None else None,
                    finish_reason=reason if done else None,
                    stop_reason=token if reason == "stop" and done else None,
                    prompt_token_ids=prompt if first else None,
                    prompt_logprobs=self._prompt_logprobs(prompt, pk) if first else None,
                )
                first = False
                if done:
                    return
        finally:
            self.running.discard(request.request_id)
            if trace is not None and not first:
                trace.first_token = trace.scheduled
                trace.last_token = time.monotonic()

    async def run(self, request: GenerationRequest, receive: Callable[[TokenEvent], None]) -> None:
        # Pushed from the engine's side, as the real engine hands them on (a subclass that
        # changes `generate` changes this too).
        events = self.generate(request)
        try:
            async for event in events:
                receive(event)
        finally:
            await events.aclose()

    @staticmethod
    def _prompt_logprobs(prompt: list[int], k: int | None) -> list[TokenLogprob | None] | None:
        if k is None:
            return None
        return [None] + [_logprob(t, k) for t in prompt[1:]]


def vllm_tool_support(
    tokenizer: Any, model: str, structured_outputs: Any = None, **kwargs: Any
) -> Any:
    """Switchboard's vLLM tool support for `--tool-call-parser hermes
    --enable-auto-tool-choice`, over a stand-in for vLLM's `AsyncLLM` holding only what it
    reads (the tokenizer, the model's name, the `--structured-outputs-config`: vLLM's
    default unless given): planning and parsing tested without an engine. `kwargs` go to
    `VllmToolSupport` (its reasoning parser)."""
    import types

    from vllm.config import StructuredOutputsConfig

    from app.engine.vllm.tools import VllmToolSupport

    llm = types.SimpleNamespace(
        get_tokenizer=lambda: tokenizer,
        model_config=types.SimpleNamespace(model=model),
        vllm_config=types.SimpleNamespace(
            structured_outputs_config=structured_outputs or StructuredOutputsConfig()
        ),
    )
    return VllmToolSupport(llm, "hermes", True, "auto", **kwargs)
