"""What vLLM's CPU build needs from its host: a KV cache size chosen up front, prompts
prefilled whole, engine processes that give way to the frontend, the frontend kept off
the cores the engine's OpenMP threads spin on when asked, and a compile cache that loads.

KV cache: with no size given, vLLM's CPU worker reserves `gpu_memory_utilization` (0.92)
of its NUMA node and refuses to start when the page cache holds part of it ("Available
memory on node 0 (8.4/9.71 GiB) on startup is less than desired CPU memory
utilization"), which is whenever the machine has recently read a few GiB of files. So on
a CPU build with no `--kv-cache-memory-bytes` and no `VLLM_CPU_KVCACHE_SPACE`, Switchboard
asks for `DEFAULT_KV_CACHE_BYTES`, or a quarter of the memory available at start when
that is less, and logs what it chose.

Whole prefills: vLLM's CPU worker kills the engine when a seeded request's prompt is
prefilled in parts: after the part it rewinds the request's torch.Generator, which only
CUDA's generators can do ("CPU Generator does not use offset"). A client's `seed` on a
long prompt in a busy batch was enough (seen in CI). So a CPU build runs without chunked
prefill unless `--enable-chunked-prefill` is given: vLLM then sizes a step's token budget
to hold the longest prompt (at least `max_model_len`), as its own CPU platform does for
the models it cannot chunk.

Frontend: vLLM binds its OpenMP threads to some cores (on a 2-core machine, core 0) and
leaves the rest for the frontend, but does not move the frontend. A frontend thread that
lands on an engine core waits behind spinning OpenMP threads and streams in bursts (TTFT
x10 at concurrency 1). `pin_frontend` reads the binding vLLM actually applied (the
affinity of the engine processes' threads) and restricts every thread of this process to
the other cores. Threads created later inherit it. It runs with `--pin-frontend` (on by
default): beside a client the kernel places (bench/frontends.py, two runs of 4 starts
each, 2026-11-26), the pinned frontend streamed 1.08-1.24x the tokens per second at 16
streams on 0.83-0.84x the CPU per token, and none of its starts fell into the slow mode
one of the unpinned frontend's eight did (0.24x its median). With the client pinned to
the engine's core (seven runs before) the kernel's own placement had done as well, since
the client kept the frontend off that core itself.

Engine niceness: vLLM's CPU build runs a scheduling process (its engine core) and a
worker process, and each waits for the other by spinning (`sched_yield` in a loop, for
up to a second after its last message): under load the worker's OpenMP thread, bound to
one core, and the engine core's loop on the other keep both cores busy even between
steps. The frontend and any client on the host share a core with a spinner, and which
core each lands on, decided by the kernel at start and kept by its wake-ups, decided how
fast the start served: measured per thread under an unpinned load, the slow starts (a
third to half of the fast ones' tokens per second, for the server's whole life) had the
client beside the spinning worker and the frontend beside the engine core's loop.
`renice_engine` gives every thread of the engine's processes a niceness (10 by default,
`--engine-niceness`): the spinning then yields to whatever else wants the core, and the
engine's own work still has every core that nothing else wants. Threads made later
inherit it.

Compilation: vLLM 0.32 with torch 2.10 or later saves each compiled model as an AOT
artifact and loads it at the next start, but on the CPU build (no inductor) the loaded
function lacks `finalize_loading`, so every start logs "Compiling model again due to a
load failure" and compiles anew. With no `VLLM_USE_AOT_COMPILE` in the environment a CPU
build uses vLLM's earlier compile cache, which loads: the engine's start took 7.8-8.5 s
against 15.0-15.3 (the tiny model, warm caches), the server was ready in 39 s against 46.

Linux only (`/proc`, `sched_setaffinity`); elsewhere the pinning is a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

logger = logging.getLogger(__name__)

GiB = 1 << 30
DEFAULT_KV_CACHE_BYTES = 4 * GiB
_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
_AOT_ENV = "VLLM_USE_AOT_COMPILE"


def kv_cache_default(engine_args: Mapping[str, Any], available_bytes: int) -> int | None:
    """The KV cache size to ask for on a CPU build, or None when the user chose one."""
    if engine_args.get("kv_cache_memory_bytes") is not None or os.environ.get(_KV_ENV):
        return None
    return max(GiB // 4, min(DEFAULT_KV_CACHE_BYTES, available_bytes // 4))


def with_cpu_kv_cache(engine_args: dict[str, Any]) -> dict[str, Any]:
    """`engine_args` with a KV cache size when vLLM's CPU build would otherwise reserve
    most of the NUMA node."""
    chosen = kv_cache_default(engine_args, psutil.virtual_memory().available)
    if chosen is None:
        return engine_args
    logger.info(
        "CPU build: no --kv-cache-memory-bytes or %s given; using a %.2f GiB KV cache "
        "(min of %d GiB and a quarter of available memory)",
        _KV_ENV,
        chosen / GiB,
        DEFAULT_KV_CACHE_BYTES // GiB,
    )
    return {**engine_args, "kv_cache_memory_bytes": chosen}


def with_whole_prefills(engine_args: dict[str, Any]) -> dict[str, Any]:
    """`engine_args` without chunked prefill, unless the user chose (see the module's
    docstring)."""
    if engine_args.get("enable_chunked_prefill") is not None:
        return engine_args
    return {**engine_args, "enable_chunked_prefill": False}


def without_aot_compile() -> None:
    """vLLM's earlier compile cache in place of its AOT artifacts, unless the environment
    chose (see the module's docstring). Read when the engine starts: call before it."""
    os.environ.setdefault(_AOT_ENV, "0")


def _thread_affinities(process: psutil.Process) -> Iterable[frozenset[int]]:
    try:
        threads = process.threads()
    except psutil.Error:
        return
    for thread in threads:
        try:
            yield frozenset(os.sched_getaffinity(thread.id))
        except OSError:  # the thread ended meanwhile
            continue


def engine_cpus(everything: frozenset[int]) -> frozenset[int]:
    """The cores some thread of a child process of ours is bound to (a thread allowed on
    every core is not bound and says nothing)."""
    bound: set[int] = set()
    for child in psutil.Process().children(recursive=True):
        for cpus in _thread_affinities(child):
            if cpus < everything:
                bound |= cpus
    return frozenset(bound)


def _engine_threads(parent: psutil.Process) -> Iterable[int]:
    """The thread ids of every process under `parent`."""
    for child in parent.children(recursive=True):
        try:
            threads = child.threads()
        except psutil.Error:
            continue
        yield from (thread.id for thread in threads)


def renice_engine(niceness: int, parent: psutil.Process | None = None) -> int:
    """Set `niceness` on every thread of the engine's processes (the children of
    `parent`, this process by default); how many threads were set. Raising a niceness
    needs no privilege."""
    if niceness == 0 or not hasattr(os, "setpriority"):
        return 0
    done = 0
    for thread in _engine_threads(parent or psutil.Process()):
        try:
            os.setpriority(os.PRIO_PROCESS, thread, niceness)
        except OSError:  # the thread ended meanwhile
            continue
        done += 1
    logger.info("engine threads at niceness %d (%d threads)", niceness, done)
    return done


def pin_frontend() -> frozenset[int] | None:
    """Restrict every thread of this process to the cores vLLM's engine left free; the
    cores chosen, or None when there is nothing to do (no binding seen, or no core
    left over)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    everything = frozenset(os.sched_getaffinity(0))
    free = everything - engine_cpus(everything)
    if not free or free == everything:
        return None
    for thread in psutil.Process().threads():
        try:
            os.sched_setaffinity(thread.id, free)
        except OSError:  # the thread ended meanwhile
            continue
    logger.info("frontend pinned to CPUs %s (the engine's threads run on the others)", sorted(free))
    return free
