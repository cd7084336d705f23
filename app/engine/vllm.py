"""`VllmEngine`: the one in-process vLLM `AsyncLLM` of the server, behind `Engine`.

The only module that imports vLLM (with `app.engine.cli_args`, and its helpers
`app.engine.vllm_structured` and `app.engine.vllm_tools`). It turns neutral
`GenerationRequest`s into vLLM calls (always token-id prompts, so every protocol shares
one tokenisation and vLLM's prefix cache sees identical prefixes) and vLLM's
`RequestOutput`s into neutral `TokenEvent` deltas. vLLM's exceptions are translated into
`app.errors` in one place, `map_engine_errors`.

A vision-language model whose image blocks are `start + N * pad + end` (the Qwen2-VL
layout, `hf_config.vision_start_token_id` / `image_token_id` / `vision_end_token_id`)
takes images: `EngineInfo.vision` says how, and a request's images go to vLLM as
multimodal data next to its token ids (`app.engine.images` says how the prompt is
prepared). Such a model never samples those three tokens: a sampled pad would be taken
for an image's placeholder the next time the text is sent back.

Invariants:
- A request whose consumer stops (closes the iterator, or its task is cancelled) is
  aborted in the engine before `generate`'s iterator finishes closing.
- `num_running_requests()` counts requests between submission and their final event.
- `engine_requests()` is the engine core's own count (its scheduler's running + waiting),
  as reported with the outputs of its latest step: it drops only once the engine core has
  finished or aborted a request, and is stale while the engine core has not stepped since
  a request was submitted (a step follows every abort, so an abort always shows).
- A request with images runs on exactly its token ids: if vLLM expands an image to a
  different number of pads than the request's block holds, the request fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from vllm import AsyncEngineArgs, SamplingParams
from vllm import __version__ as vllm_version
from vllm.config import VllmConfig
from vllm.envs import disable_envs_cache, enable_envs_cache
from vllm.exceptions import (
    GracefulHTTPError,
    MaxQueuedTokensError,
    QueueOverflowError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.inputs import TokensPrompt
from vllm.inputs.engine import TokensInput, tokens_input
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from app.config import Settings
from app.engine.base import (
    EngineInfo,
    FinishReason,
    GenerationRequest,
    LoraAdapter,
    ReadoutManifest,
    SamplingOptions,
    TokenEvent,
    TokenLogprob,
    VisionInfo,
)
from app.engine.batch_gate import BatchGate
from app.engine.concepts import Concepts, load_concepts
from app.engine.cpu_host import pin_frontend, with_cpu_kv_cache, with_whole_prefills
from app.engine.images import ImageReader, collapse_blocks
from app.engine.readout_client import ReadoutBatcher, ReadoutTracker
from app.engine.readout_worker import READOUT_ID_KEY, READOUT_KEY, ReadoutWorkerExtension
from app.engine.validation import check_prompt, validate_sampling
from app.engine.vllm_structured import constraint_checker, structured_outputs
from app.engine.vllm_tools import VllmToolSupport
from app.errors import (
    ConfigError,
    EngineDead,
    EngineError,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Overloaded,
    ResourceExhausted,
    SwitchboardError,
)

logger = logging.getLogger(__name__)

READOUT_EXTENSION = f"{ReadoutWorkerExtension.__module__}.{ReadoutWorkerExtension.__name__}"

# Defaults that differ from vLLM's own: prefix caching always on (sessions depend on it)
# and the priority scheduler, which with every priority at 0 is first-come-first-served.
ENGINE_DEFAULTS: dict[str, Any] = {
    "enable_prefix_caching": True,
    "scheduling_policy": "priority",
}


def _translated(exc: BaseException) -> SwitchboardError | None:
    """The `app.errors` form of a vLLM exception, by its type, most specific first; None
    for anything else."""
    if isinstance(exc, EngineDeadError):
        return EngineDead("The engine is not running; the server must be restarted")
    if isinstance(exc, VLLMNotFoundError):
        return NotFound(str(exc))
    if isinstance(exc, VLLMValidationError | VLLMUnprocessableEntityError):
        # str() of these appends the rejected value, which may be anything a client sent.
        return InvalidRequest(str(exc.args[0]) if exc.args else "", param=exc.parameter)
    if isinstance(exc, VLLMClientError):
        return InvalidRequest(str(exc))
    if isinstance(exc, QueueOverflowError | MaxQueuedTokensError):
        # vLLM's own admission (--max-num-queued-reqs/-tokens passed through): refused as
        # ours is (app.admission), 503 with a retry hint.
        return Overloaded(exc.message, retry_after_s=1)
    if isinstance(exc, GracefulHTTPError):  # busy now, fine later
        return ResourceExhausted(exc.message)
    if isinstance(exc, EngineGenerateError | VLLMError):
        error_id = uuid.uuid4().hex[:16]
        logger.error("engine error %s", error_id, exc_info=exc)
        return EngineError(f"The engine failed the request (error id {error_id})")
    return None


class _EngineErrorMap:
    """The context manager `map_engine_errors` returns: stateless, so one serves every
    call (it is entered once per streamed token; a generator-based one would be built
    each time)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None and (mapped := _translated(exc)) is not None:
            raise mapped from exc


_ENGINE_ERROR_MAP = _EngineErrorMap()


def map_engine_errors() -> _EngineErrorMap:
    """Translate vLLM's exceptions into `app.errors` by their types (`_translated`).

    Wraps calls into vLLM only, never our own code: anything else escaping (a built-in
    ValueError included) is a bug, ours or vLLM's, and reaches the transport as an
    `InternalError`. vLLM has no type for a prompt over the context (it raises a plain
    `VLLMValidationError`), so `app.engine.validation.check_prompt` runs before it is
    asked and its `ContextLengthExceeded` is the only one there is.
    """
    return _ENGINE_ERROR_MAP


# vLLM clamps a logit bias to [-100, 100]; -100 is the customary ban.
_BANNED = -100.0


def sampling_params(
    options: SamplingOptions,
    extra_args: dict[str, Any] | None = None,
    banned_token_ids: frozenset[int] = frozenset(),
) -> SamplingParams:
    """Neutral options -> vLLM's SamplingParams (streamed as deltas)."""
    with map_engine_errors():
        return SamplingParams(
            n=1,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            min_p=options.min_p,
            seed=options.seed,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
            repetition_penalty=options.repetition_penalty,
            stop=list(options.stop) or None,
            stop_token_ids=list(options.stop_token_ids) or None,
            include_stop_str_in_output=options.include_stop_str_in_output,
            ignore_eos=options.ignore_eos,
            min_tokens=options.min_tokens,
            logprobs=options.logprobs,
            prompt_logprobs=options.prompt_logprobs,
            skip_special_tokens=options.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
            logit_bias={**dict(options.logit_bias), **dict.fromkeys(banned_token_ids, _BANNED)}
            or None,
            structured_outputs=structured_outputs(options.constraint),
        )


def _token_logprob(token_id: int, position: Mapping[int, Any], k: int) -> TokenLogprob:
    chosen = position.get(token_id)
    top = {
        tid: lp.logprob
        for tid, lp in sorted(position.items(), key=lambda item: item[1].rank or 0)
        if lp.rank is not None and lp.rank <= k
    }
    return TokenLogprob(
        token_id=token_id,
        logprob=chosen.logprob if chosen is not None else float("-inf"),
        rank=chosen.rank if chosen is not None else None,
        top=top,
    )


class HfTokenizer:
    """The engine's own tokenizer, behind the neutral `Tokenizer` protocol."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.token_to_str = lru_cache(maxsize=1 << 16)(self._token_to_str)

    @property
    def has_chat_template(self) -> bool:
        return getattr(self._tok, "chat_template", None) is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
    ) -> list[int]:
        if not self.has_chat_template:
            raise InvalidRequest("This model has no chat template", param="messages")
        try:
            text = self._tok.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
            )
        except Exception as exc:  # a jinja template error is the client's input
            raise InvalidRequest(f"Could not apply the chat template: {exc}") from exc
        # The template writes its own special tokens; adding BOS again would double it.
        return self.encode(str(text), add_special_tokens=False)

    def _token_to_str(self, token_id: int) -> str:
        return str(self._tok.decode([token_id], skip_special_tokens=False))


def _engine_config(args: dict[str, Any]) -> VllmConfig:
    """vLLM's configuration from the engine arguments; arguments that do not work are a
    `ConfigError` (vLLM reports them as TypeError, ValueError, pydantic's ValidationError,
    or OSError for a model it cannot find)."""
    try:
        return AsyncEngineArgs(**args).create_engine_config(UsageContext.ENGINE_CONTEXT)
    except ValidationError as exc:  # its first line only counts the errors
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(
            f"the engine arguments do not work: {where + ': ' if where else ''}{first['msg']}"
        ) from exc
    except (TypeError, ValueError, OSError) as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise ConfigError(f"the engine arguments do not work: {lines[0]}") from exc


async def _setup_readouts(llm: AsyncLLM, path: Path, concepts: Concepts) -> ReadoutManifest:
    with map_engine_errors():
        await llm.collective_rpc("readout_setup", args=(str(path),))
    return ReadoutManifest(
        concepts=concepts.names, layers=concepts.layers, hidden_size=concepts.hidden_size
    )


def _vision_info(llm: AsyncLLM) -> VisionInfo | None:
    """How the model takes images, or None if it takes none we can place."""
    model_config = llm.model_config
    if not model_config.is_multimodal_model:
        return None
    hf_config = model_config.hf_config
    start = getattr(hf_config, "vision_start_token_id", None)
    pad = getattr(hf_config, "image_token_id", None)
    end = getattr(hf_config, "vision_end_token_id", None)
    processing = llm.renderer.get_mm_processor().info
    image_processor = getattr(processing.get_hf_processor(), "image_processor", None)
    if (
        start is None
        or pad is None
        or end is None
        or image_processor is None
        or not hasattr(image_processor, "get_number_of_image_patches")
        or not hasattr(image_processor, "merge_size")
        or not hasattr(processing, "get_num_image_tokens")
    ):
        logger.warning(
            "%s is multimodal, but its image blocks are not start + N pads + end with an "
            "image processor that counts N; it is served without images",
            model_config.model,
        )
        return None
    mm_config = model_config.get_multimodal_config()
    mm_kwargs = mm_config.mm_processor_kwargs or {}

    def engine_count(width: int, height: int) -> int:
        # The number of pads vLLM's processor replaces an image's placeholder with; it
        # merges the configured processor kwargs itself (a request adds none).
        return int(
            processing.get_num_image_tokens(
                image_width=width,
                image_height=height,
                image_processor=image_processor,
                mm_kwargs={},
            )
        )

    return VisionInfo(
        start_token_id=int(start),
        pad_token_id=int(pad),
        end_token_id=int(end),
        max_images=int(mm_config.get_limit_per_prompt("image")),
        read_image=ImageReader(image_processor, mm_kwargs, engine_count),
    )


class SchedulerCounts(StatLoggerBase):  # type: ignore[misc]  # mypy skips vLLM: Any
    """The requests the engine core holds, from the scheduler stats that come with the
    outputs of each of its steps (the source of `vllm:num_requests_running` and
    `vllm:num_requests_waiting`, kept here because a second engine in the process takes
    those gauges over). The frontend's own request table is no substitute: an abort
    empties it before the engine core has heard of the abort."""

    def __init__(self) -> None:
        self.requests = 0

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.requests = (
                scheduler_stats.num_running_reqs
                + scheduler_stats.num_waiting_reqs
                + scheduler_stats.num_skipped_waiting_reqs
            )

    def log_engine_initialized(self) -> None:
        pass


class VllmEngine:
    """One `AsyncLLM` for the whole process."""

    def __init__(
        self, llm: AsyncLLM, info: EngineInfo, tokenizer: HfTokenizer, counts: SchedulerCounts
    ) -> None:
        self._llm = llm
        self._counts = counts
        self._info = info
        self._tokenizer = tokenizer
        self._loras: dict[str, LoraAdapter] = {}
        self._next_lora_id = 1
        self._running: set[str] = set()
        self._readouts = ReadoutBatcher(self._take_readouts)
        # Prompt logprobs must run alone where vLLM's CPU LoRA logits path runs (see
        # app.engine.batch_gate); None elsewhere, and then no request waits for anything.
        lora_on_cpu = info.max_loras > 0 and current_platform.is_cpu()
        self._gate = BatchGate() if lora_on_cpu else None

    @classmethod
    async def start(cls, settings: Settings) -> VllmEngine:
        # This start reads the environment as it is now (another engine in the process may
        # have frozen it); `_started` freezes it again.
        disable_envs_cache()
        args = {
            **ENGINE_DEFAULTS,
            **settings.engine_args,
            "model": settings.model,
            # vLLM labels its metrics with this name; the picker matches it to `model`.
            "served_model_name": settings.model_name,
        }
        if settings.lora_modules:
            args.setdefault("enable_lora", True)
        if settings.readout_concepts is not None:
            args["worker_extension_cls"] = READOUT_EXTENSION
            # Forward hooks do not fire inside a compiled graph.
            args.setdefault("enforce_eager", True)
        if args.get("enable_lora"):
            # Runtime loading through /v1/load_lora_adapter, as vLLM's server gates it.
            os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
        # Every start-up check that needs no engine runs before it: a bad flag or file
        # should not cost an engine start.
        concepts = None
        if settings.readout_concepts is not None:
            concepts = load_concepts(settings.readout_concepts)
        for name, path in settings.lora_pairs():
            if not os.path.isdir(path):
                raise ConfigError(f"--lora-modules {name}={path}: no such directory")
        cpu = current_platform.is_cpu()
        if cpu:
            args = with_whole_prefills(with_cpu_kv_cache(args))
        vllm_config = _engine_config(args)
        if concepts is not None:
            model_config = vllm_config.model_config
            concepts.check_model(
                model_config.get_hidden_size(), model_config.get_total_num_hidden_layers()
            )
        counts = SchedulerCounts()
        llm = AsyncLLM.from_vllm_config(
            vllm_config,
            stat_loggers=[lambda _config, _index: counts],
            enable_log_requests=bool(args.get("enable_log_requests", False)),
            disable_log_stats=bool(args.get("disable_log_stats", False)),
        )
        try:
            return await cls._started(llm, settings, concepts, counts)
        except BaseException:
            llm.shutdown()
            raise

    @classmethod
    async def _started(
        cls, llm: AsyncLLM, settings: Settings, concepts: Concepts | None, counts: SchedulerCounts
    ) -> VllmEngine:
        if current_platform.is_cpu() and settings.pin_frontend:
            pin_frontend()
        # vLLM reads its settings from the environment on every access (an os.getenv per
        # `envs.X`, several per engine step: 3% of the frontend's CPU at 32 streams) until
        # the cache is on, as vLLM's own engine processes turn it on once started.
        enable_envs_cache()
        tokenizer = HfTokenizer(llm.get_tokenizer())
        model_config = llm.model_config
        eos = getattr(tokenizer._tok, "eos_token_id", None)
        lora_config = llm.vllm_config.lora_config
        max_logprobs = int(model_config.max_logprobs)
        vocab_size = int(model_config.get_vocab_size())
        info = EngineInfo(
            model_name=settings.model_name,
            model_path=settings.model,
            max_model_len=int(model_config.max_model_len),
            vocab_size=vocab_size,
            eos_token_ids=(int(eos),) if eos is not None else (),
            has_chat_template=tokenizer.has_chat_template,
            max_loras=int(lora_config.max_loras) if lora_config is not None else 0,
            max_logprobs=vocab_size if max_logprobs == -1 else max_logprobs,
            engine_version=f"vllm {vllm_version}",
            vision=_vision_info(llm),
            check_constraint=constraint_checker(llm),
            tools=VllmToolSupport(
                llm,
                settings.tool_call_parser,
                settings.enable_auto_tool_choice,
                settings.tool_strict_level,
            ),
        )
        if concepts is not None and settings.readout_concepts is not None:
            info = replace(
                info, readout=await _setup_readouts(llm, settings.readout_concepts, concepts)
            )
        engine = cls(llm, info, tokenizer, counts)
        for name, path in settings.lora_pairs():
            try:
                await engine.load_lora(name, path)
            except InvalidRequest as exc:
                raise ConfigError(f"--lora-modules {name}={path}: {exc.message}") from exc
        return engine

    def shutdown(self) -> None:
        self._llm.shutdown()

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> HfTokenizer:
        return self._tokenizer

    # -- models and adapters -------------------------------------------------------

    def has_model(self, name: str) -> bool:
        return name == self._info.model_name or name in self._loras

    def loras(self) -> Sequence[LoraAdapter]:
        return list(self._loras.values())

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        if self._info.max_loras == 0:
            raise InvalidRequest("LoRA is not enabled; start the server with --enable-lora")
        if name == self._info.model_name or name in self._loras:
            raise InvalidRequest(f"The model {name!r} is already loaded", param="lora_name")
        if not os.path.isdir(path):
            raise InvalidRequest(f"No LoRA adapter directory at {path!r}", param="lora_path")
        adapter = LoraAdapter(name=name, path=path, int_id=self._next_lora_id)
        self._next_lora_id += 1
        request = LoRARequest(lora_name=name, lora_int_id=adapter.int_id, lora_path=path)
        try:
            with map_engine_errors():
                await self._llm.add_lora(request)
        except EngineDead:
            raise
        except SwitchboardError as exc:
            raise InvalidRequest(f"Could not load LoRA adapter {name!r}: {exc.message}") from exc
        except Exception as exc:  # vLLM reports a bad adapter with assorted errors
            raise InvalidRequest(f"Could not load LoRA adapter {name!r}: {exc}") from exc
        self._loras[name] = adapter
        return adapter

    async def unload_lora(self, name: str) -> None:
        adapter = self._loras.pop(name, None)
        if adapter is None:
            raise NotFound(f"The LoRA adapter {name!r} is not loaded", param="lora_name")
        with map_engine_errors():
            await self._llm.remove_lora(adapter.int_id)

    def _lora_request(self, name: str | None) -> LoRARequest | None:
        if name is None or name == self._info.model_name:
            return None
        adapter = self._loras.get(name)
        if adapter is None:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        return LoRARequest(lora_name=name, lora_int_id=adapter.int_id, lora_path=adapter.path)

    # -- requests ------------------------------------------------------------------

    def num_running_requests(self) -> int:
        return len(self._running)

    def engine_requests(self) -> int:
        return self._counts.requests

    async def check_health(self) -> None:
        with map_engine_errors():
            await self._llm.check_health()

    async def abort(self, request_id: str) -> None:
        with map_engine_errors():
            await self._llm.abort(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            prompt_ids = self._tokenizer.encode(request.prompt_text or "")
        # The cores validated already; this is the safety net, and the one context check
        # (vLLM has no exception type for it).
        options = validate_sampling(request.sampling, self._info, prefill_only=True)
        check_prompt(prompt_ids, options.max_tokens, self._info)
        # vLLM always samples at least one token: a prefill-only request (scoring) samples
        # one and drops it.
        prefill_only = options.max_tokens == 0
        if prefill_only:
            options = replace(options, max_tokens=1, logprobs=None)
        lora = self._lora_request(request.lora_name)
        readouts = self._readout_args(request)
        vision = self._info.vision
        params = sampling_params(
            options, readouts, vision.token_ids if vision is not None else frozenset()
        )
        tracker = ReadoutTracker(request.readout_ranges, len(prompt_ids)) if readouts else None
        output_tokens = 0
        stream = self._llm.generate(
            self._prompt(prompt_ids, request),
            params,
            request.request_id,
            lora_request=lora,
            priority=request.priority,
        )
        converter = _EventConverter(prompt_ids, options)
        echo_due = bool(request.images)
        release = (
            await self._gate.enter(exclusive=options.prompt_logprobs is not None)
            if self._gate is not None
            else _nothing
        )
        self._running.add(request.request_id)
        try:
            while True:
                # Only the call into vLLM is mapped: a bug in what follows is ours.
                with map_engine_errors():
                    try:
                        output = await anext(stream)
                    except StopAsyncIteration:
                        break
                if echo_due:
                    _check_expansion(prompt_ids, output.prompt_token_ids)
                    echo_due = False
                event = converter.convert(output)
                if event is None:
                    continue
                output_tokens += len(event.token_ids)
                if tracker is not None and tracker.due(output_tokens):
                    taken = await self._readouts.take(request.request_id)
                    event = replace(event, readouts=taken)
                if prefill_only:
                    yield replace(
                        event,
                        token_ids=[],
                        text="",
                        logprobs=None,
                        finish_reason="length",
                        stop_reason=None,
                        readouts=_prompt_only(event.readouts, len(prompt_ids)),
                    )
                    return
                yield event
        finally:
            try:
                self._running.discard(request.request_id)
                # Closing vLLM's generator aborts the request if it has not finished;
                # shield it so a cancelled consumer still completes the abort.
                await asyncio.shield(stream.aclose())
                if readouts is not None:
                    with map_engine_errors():
                        await asyncio.shield(
                            self._llm.collective_rpc("readout_drop", args=(request.request_id,))
                        )
            finally:
                release()  # after the abort: vLLM handles it before the next request

    def _prompt(
        self, prompt_ids: list[int], request: GenerationRequest
    ) -> TokensInput | TokensPrompt:
        if not request.images:
            # Already rendered: vLLM takes it on the event loop. A raw TokensPrompt would
            # make a round trip through vLLM's renderer thread for nothing, and each hop
            # costs the frontend a GIL hand-over (8% of its CPU at 32 streams, profiled).
            return tokens_input(prompt_ids)
        vision = self._info.vision
        if vision is None:
            raise InvalidRequest(
                f"The model {self._info.model_name!r} takes no images", param="images"
            )
        if len(request.images) > vision.max_images:
            raise InvalidRequest(
                f"{len(request.images)} images in one prompt; the engine takes at most "
                f"{vision.max_images}",
                param="images",
            )
        images = request.images
        return TokensPrompt(
            prompt_token_ids=collapse_blocks(prompt_ids, images, vision),
            multi_modal_data={"image": [block.image.pixels for block in images]},
            multi_modal_uuids={"image": [block.image.digest for block in images]},
        )

    def _readout_args(self, request: GenerationRequest) -> dict[str, Any] | None:
        if not request.readout_ranges:
            return None
        if self._info.readout is None:
            raise InvalidRequest(
                "Readouts are not configured on this server (--readout-concepts)",
                param="readout_ranges",
            )
        ranges = [[int(start), int(end)] for start, end in request.readout_ranges]
        if any(start < 0 or end < start for start, end in ranges):
            raise InvalidRequest("readout ranges must be [start, end)", param="readout_ranges")
        return {READOUT_KEY: ranges, READOUT_ID_KEY: request.request_id}

    async def _take_readouts(self, request_ids: list[str]) -> dict[str, list[tuple[int, bytes]]]:
        with map_engine_errors():
            per_worker = await self._llm.collective_rpc("readout_take", args=(request_ids,))
        # Every tensor-parallel rank computes the same residual stream; rank 0's suffices.
        taken: dict[str, list[tuple[int, bytes]]] = per_worker[0]
        return taken


def _nothing() -> None:
    """The release of a gate not held."""


def _check_expansion(prompt_ids: list[int], expanded: Sequence[int] | None) -> None:
    """vLLM expanded the request's images itself; it must have rebuilt its exact tokens."""
    if expanded is not None and list(expanded) != prompt_ids:
        raise InvalidRequest(
            f"The engine expanded the images into a prompt of {len(expanded)} tokens, "
            f"not the {len(prompt_ids)} of the request: an image's block does not hold "
            "the number of pad tokens the engine makes of it",
            param="images",
        )


def _prompt_only(readouts: Mapping[int, bytes] | None, length: int) -> dict[int, bytes] | None:
    """A prefill-only request sampled one token it will not return: keep the prompt's
    positions only."""
    if readouts is None:
        return None
    return {p: v for p, v in readouts.items() if p < length}


class _EventConverter:
    """Turns one request's `RequestOutput` deltas into `TokenEvent`s."""

    def __init__(self, prompt_ids: list[int], options: SamplingOptions) -> None:
        self._prompt_ids = prompt_ids
        self._k = options.logprobs
        self._prompt_k = options.prompt_logprobs
        self._first = True
        self._pending_prompt_logprobs: list[TokenLogprob | None] = []

    def _prompt_logprobs(self, output: RequestOutput) -> None:
        if output.prompt_logprobs is None or self._prompt_k is None:
            return
        start = len(self._pending_prompt_logprobs)
        for offset, position in enumerate(output.prompt_logprobs):
            if position is None:
                self._pending_prompt_logprobs.append(None)
                continue
            token_id = self._prompt_ids[start + offset]
            self._pending_prompt_logprobs.append(_token_logprob(token_id, position, self._prompt_k))

    def convert(self, output: RequestOutput) -> TokenEvent | None:
        self._prompt_logprobs(output)
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        if not token_ids and not output.finished:
            return None  # a prefill chunk: hold its prompt logprobs for the first event
        logprobs = None
        if self._k is not None and completion.logprobs is not None:
            logprobs = [
                _token_logprob(tid, position, self._k)
                for tid, position in zip(token_ids, completion.logprobs, strict=False)
            ]
        first = self._first
        self._first = False
        finish: FinishReason | None = None
        if output.finished:
            reason = completion.finish_reason
            finish = reason if reason in ("stop", "length") else "abort"
        return TokenEvent(
            token_ids=token_ids,
            text=completion.text,
            logprobs=logprobs,
            finish_reason=finish,
            stop_reason=completion.stop_reason if output.finished else None,
            prompt_token_ids=self._prompt_ids if first else None,
            prompt_logprobs=(
                self._pending_prompt_logprobs if first and self._prompt_k is not None else None
            ),
            num_cached_tokens=int(output.num_cached_tokens or 0) if first else 0,
        )
