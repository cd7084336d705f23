"""Starting the process's engine from `Settings`, and what the process does once it runs.

`start_engine` checks every flag and file that needs no engine first (concepts, LoRA
directories, vLLM's own engine arguments), applies the CPU host's defaults, starts
vLLM's `AsyncLLM` and gathers what the protocols need to know about it (`EngineInfo`:
the model's limits, tools, vision, readouts, and the KV-cache and scheduler facts
routers pair workers by, read with smg-grpc-servicer's own readers), its processes
held by the server (`app.engine.vllm.hold`: they outlive signals meant for the server
until it stops them). `settle_heap` is for `switchboard serve` once the app is built.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from smg_grpc_servicer.vllm.kv_transfer import pairing_fields
from smg_grpc_servicer.vllm.model_info import (
    constrained_decoding_start,
    engine_reasoning_parser,
    running_window,
)
from vllm import AsyncEngineArgs
from vllm import __version__ as vllm_version
from vllm.config import VllmConfig
from vllm.envs import disable_envs_cache, enable_envs_cache
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext
from vllm.utils.gc_utils import freeze_gc_heap
from vllm.v1.engine.async_llm import AsyncLLM

from app.config import Settings
from app.engine.base import EngineInfo, ReadoutManifest
from app.engine.concepts import Concepts
from app.engine.cpu_host import (
    engine_session_announced,
    engine_spin_announced,
    pin_frontend,
    renice_engine,
    with_cpu_kv_cache,
    with_whole_prefills,
    without_aot_compile,
)
from app.engine.preflight import check_files
from app.engine.readout_worker import ReadoutWorkerExtension
from app.engine.vllm.engine import VllmEngine
from app.engine.vllm.errors import map_engine_errors
from app.engine.vllm.hold import EngineHold
from app.engine.vllm.params import model_sampling_defaults
from app.engine.vllm.render_process import RenderProcess
from app.engine.vllm.stats import SchedulerCounts
from app.engine.vllm.structured import constraint_checker
from app.engine.vllm.tokenizer import HfTokenizer
from app.engine.vllm.tools import VllmToolSupport
from app.engine.vllm.vision import vision_info
from app.errors import ConfigError, InvalidRequest

if TYPE_CHECKING:
    from app.telemetry.tracing import Tracing

READOUT_EXTENSION = f"{ReadoutWorkerExtension.__module__}.{ReadoutWorkerExtension.__name__}"

# Defaults that differ from vLLM's own: prefix caching always on (sessions depend on it)
# and the priority scheduler, which with every priority at 0 is first-come-first-served.
ENGINE_DEFAULTS: dict[str, Any] = {
    "enable_prefix_caching": True,
    "scheduling_policy": "priority",
}


# The youngest generation's threshold while serving (CPython's default: 700). Measured at
# 64 streams (3,072 streamed completions of 64 tokens, the collector timed by
# `gc.callbacks`): at 700 the collector ran 0.39-0.40 s of the frontend's ~9.5 s (4%: 665
# youngest collections, and 60 of the middle generation at 3.6 ms each, which walk every
# request's live state); at 10,000, 0.06 s in 8 youngest collections of ~7 ms and none
# of the others. A pause of 7 ms once a second against 3.6 ms seven times a second.
YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Freeze what start-up built (vLLM, torch, transformers, the app: some 700k objects),
    which lives as long as the process, and collect the young less often.

    Frozen, start-up's objects are no longer walked by an oldest-generation collection,
    which here stalls the event loop, and so every stream, for 0.2-0.4 s (measured); such
    collections are rare under load (none in 3,300 requests at 16 streams), but a
    long-running server meets them; vLLM's own server freezes its start-up heap the same
    way. The young are what every token allocates (events, frames, vLLM's outputs), nearly
    all freed by reference counting before any collection: collecting them every 700
    allocations cost 4% of the frontend's CPU at 64 streams (`YOUNG_THRESHOLD`)."""
    freeze_gc_heap()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


async def start_engine(settings: Settings, tracing: Tracing | None = None) -> VllmEngine:
    """The process's engine, started from `settings`; a flag or file that cannot work is a
    `ConfigError`, raised before the engine starts where it can. `tracing` (the server's
    tracer, with --otlp-traces-endpoint) is lent to vLLM before its engine is built
    (`Tracing.lend_to_vllm`): vLLM's spans then go out through the server's exporter."""
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
    # Every start-up check that needs no engine runs before it: a bad flag or file
    # should not cost an engine start.
    concepts = check_files(settings)
    cpu = current_platform.is_cpu()
    if cpu:
        args = with_whole_prefills(with_cpu_kv_cache(args))
        without_aot_compile()
    vllm_config = _engine_config(args)
    if concepts is not None:
        model_config = vllm_config.model_config
        concepts.check_model(
            model_config.get_hidden_size(), model_config.get_total_num_hidden_layers()
        )
    # Big prompts' templating (app.engine.vllm.render_process), started now, before the
    # engine's processes learn what the environment announces to them: its import of
    # vLLM runs beside the engine's start, with what CPU that leaves over.
    render_process = None
    if settings.render_process:
        render_process = RenderProcess(vllm_config, int(vllm_config.model_config.max_model_len))
        render_process.start()
    try:
        return await _start(settings, args, vllm_config, concepts, render_process, tracing)
    except BaseException:
        if render_process is not None:
            render_process.close()
        raise


async def _start(
    settings: Settings,
    args: dict[str, Any],
    vllm_config: VllmConfig,
    concepts: Concepts | None,
    render_process: RenderProcess | None,
    tracing: Tracing | None,
) -> VllmEngine:
    cpu = current_platform.is_cpu()
    counts = SchedulerCounts()
    # The engine's processes learn of the hold from the environment they start with.
    hold = EngineHold()
    if tracing is not None:
        tracing.lend_to_vllm()
    try:
        niceness = settings.engine_niceness if cpu else 0
        spin_ms = settings.engine_spin_ms if cpu else None
        with (
            hold.announced(),
            engine_session_announced(niceness),
            engine_spin_announced(spin_ms),
        ):
            llm = AsyncLLM.from_vllm_config(
                vllm_config,
                stat_loggers=[lambda _config, _index: counts],
                enable_log_requests=bool(args.get("enable_log_requests", False)),
                disable_log_stats=bool(args.get("disable_log_stats", False)),
            )
    except BaseException:
        hold.release()
        raise
    try:
        return await _started(llm, settings, concepts, counts, hold, render_process)
    except BaseException:
        hold.release()
        llm.shutdown()
        raise


async def _started(
    llm: AsyncLLM,
    settings: Settings,
    concepts: Concepts | None,
    counts: SchedulerCounts,
    hold: EngineHold,
    render_process: RenderProcess | None,
) -> VllmEngine:
    if current_platform.is_cpu():
        renice_engine(settings.engine_niceness)
        if settings.pin_frontend:
            pin_frontend()
    # vLLM reads its settings from the environment on every access (an os.getenv per
    # `envs.X`, several per engine step: 3% of the frontend's CPU at 32 streams) until
    # the cache is on, as vLLM's own engine processes turn it on once started.
    enable_envs_cache()
    model_config = llm.model_config
    max_model_len = int(model_config.max_model_len)
    tokenizer = HfTokenizer(llm.get_tokenizer(), llm.renderer, max_model_len, render_process)
    eos = tokenizer.eos_token_id
    lora_config = llm.vllm_config.lora_config
    max_logprobs = int(model_config.max_logprobs)
    vocab_size = int(model_config.get_vocab_size())
    # What SMG pairs and counts workers by, read as `vllm serve --grpc` reads it
    # (smg-grpc-servicer's readers), off the config the start resolved (its block size).
    pairing = pairing_fields(llm.vllm_config)
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
        vision=vision_info(llm),
        check_constraint=constraint_checker(llm),
        sampling_defaults=model_sampling_defaults(model_config),
        trust_request_chat_template=settings.trust_request_chat_template,
        tools=VllmToolSupport(
            llm,
            settings.tool_call_parser,
            settings.enable_auto_tool_choice,
            settings.tool_strict_level,
            reasoning_parser=llm.vllm_config.structured_outputs_config.reasoning_parser or None,
        ),
        kv_block_size=int(pairing.get("block_size", 0)),
        kv_cache_dtype=str(pairing.get("kv_cache_dtype", "")),
        model_dtype=str(pairing.get("model_dtype", "")),
        max_num_seqs=running_window(llm.vllm_config),
        reasoning_parser=engine_reasoning_parser(llm.vllm_config),
        grammar_start=constrained_decoding_start(llm.vllm_config),
    )
    if concepts is not None and settings.readout_concepts is not None:
        info = replace(
            info, readout=await _setup_readouts(llm, settings.readout_concepts, concepts)
        )
    engine = VllmEngine(llm, info, tokenizer, counts, hold)
    for name, path in settings.lora_pairs():
        try:
            await engine.load_lora(name, path)
        except InvalidRequest as exc:
            raise ConfigError(f"--lora-modules {name}={path}: {exc.message}") from exc
    return engine


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
