"""What vLLM's CPU build needs from its host: a KV cache size chosen up front, prompts
prefilled whole, engine processes that give way to the frontend, the frontend kept off
the cores the engine's OpenMP threads spin on when asked, and a compile cache that loads.
The measurements behind each rule: bench/results/README.md, "The engine's host".

KV cache: with no size given, vLLM's CPU worker reserves `gpu_memory_utilization` (0.92)
of its NUMA node and refuses to start when the page cache holds part of it, which is
whenever the machine has recently read a few GiB of files. So on a CPU build with no
`--kv-cache-memory-bytes` and no `VLLM_CPU_KVCACHE_SPACE`, Switchboard asks for
`DEFAULT_KV_CACHE_BYTES`, or a quarter of the memory available at start when that is
less, and logs what it chose.

Whole prefills: vLLM's CPU worker kills the engine when a seeded request's prompt is
prefilled in parts: after the part it rewinds the request's torch.Generator, which only
CUDA's generators can do ("CPU Generator does not use offset"). So a CPU build runs
without chunked prefill unless `--enable-chunked-prefill` is given: vLLM then sizes a
step's token budget to hold the longest prompt (at least `max_model_len`), as its own
CPU platform does for the models it cannot chunk.

Frontend: vLLM binds its OpenMP threads to some cores (on a 2-core machine, core 0) and
leaves the rest for the frontend, but does not move the frontend. A frontend thread that
lands on an engine core waits behind spinning OpenMP threads and streams in bursts.
`pin_frontend` reads the binding vLLM actually applied (the affinity of the engine
processes' threads) and restricts every thread of this process to the other cores;
threads created later inherit it. It runs with `--pin-frontend`, on by default: beside a
client the kernel places, the pinned frontend streams more tokens per second on less CPU
per token, and none of its starts falls into the slow mode an unpinned one can.

Engine niceness: vLLM's CPU build runs a scheduling process (its engine core) and a
worker process, and each waits for the other by spinning (`sched_yield` in a loop, for
up to a second after its last message), so under load both cores stay busy even between
steps, and a frontend or client that the kernel placed beside a spinner is slowed for the
server's whole life. `renice_engine` gives every thread of the engine's processes a
niceness (10 by default, `--engine-niceness`): the spinning then yields to whatever else
wants the core, and the engine's own work still has every core nothing else wants.
Threads made later inherit it; since a sweep can miss a thread started while it walks,
each engine process also sets it on its starting thread as it starts (`engine_session`),
so that what it starts from then on is born at it.

Engine session: a niceness weighs only against the threads of its own scheduling group,
and where the kernel groups by session (autogroup, on by default on many kernels, for
every process outside a cgroup of its own) a server started in a session of its own (a
service, `setsid`, bench/harness.py) faces a client in another one at the group's full
weight. So the engine core takes a session of its own (`engine_session`, a vLLM general
plugin run in each engine process as it starts, before it starts its workers, which join
it; `own_session`, which the body worker's children take too), whose group runs at the
same niceness: the engine then gives way to every other
session on the host, the frontend's included. Out of the server's session and process
group it no longer gets the signals sent to them, and could outlive a server killed
outright: it asks the kernel for SIGTERM when the server's thread that started it ends,
which the engine obeys once the server is gone (app/engine/vllm/hold.py).

Engine spin: the waits described above are vLLM's shared-memory queues between the
engine core and its workers (`SpinCondition`): a reader busy-waits for a second after its
last message before it sleeps on the queue's socket, a value vLLM does not let one set.
While the engine steps, messages come every few milliseconds and the spin saves a wake-up
each; after the last step of a burst it is a second of a core or two for nothing, which on
a host shared with other work (a test suite, a load client, another server) is taken from
that work. `--engine-spin-ms` sets it (`engine_spin`, in each engine process as it
starts, before its queues are made); unset, vLLM's second stands.

Compilation: vLLM 0.32 with torch 2.10 or later saves each compiled model as an AOT
artifact and loads it at the next start, but on the CPU build (no inductor) the loaded
function lacks `finalize_loading`, so every start logs "Compiling model again due to a
load failure" and compiles anew. With no `VLLM_USE_AOT_COMPILE` in the environment a CPU
build uses vLLM's earlier compile cache, which loads: about half the engine's start.

Linux only (`/proc`, `sched_setaffinity`); elsewhere the pinning is a no-op.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from app.engine.announce import announced

logger = logging.getLogger(__name__)

GiB = 1 << 30
DEFAULT_KV_CACHE_BYTES = 4 * GiB
_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
_AOT_ENV = "VLLM_USE_AOT_COMPILE"
# Set by the server while its engine starts: "<server pid> <niceness>".
SESSION_ENV = "SWITCHBOARD_ENGINE_SESSION"
# Set by the server while its engine starts: the seconds the engine's processes spin.
SPIN_ENV = "SWITCHBOARD_ENGINE_SPIN_S"
_VLLM_SPIN_S = 1  # vLLM 0.32's SpinCondition(busy_loop_s=1)
ENGINE_TITLE = "VLLM::"  # how vLLM names its engine core's and workers' processes
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_AUTOGROUP_TRIES = 10  # of the kernel's one write a tenth of a second: a second in all


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


def _is_engine(process: psutil.Process) -> bool:
    try:
        name: str = process.name()
    except psutil.Error:  # it ended meanwhile
        return False
    return name.startswith(ENGINE_TITLE)


def engine_cpus(everything: frozenset[int], parent: psutil.Process | None = None) -> frozenset[int]:
    """The cores some thread of an engine process under `parent` (this process by default)
    is bound to (a thread allowed on every core is not bound and says nothing). Only
    vLLM's: any other child (the body worker) was started by a pinned thread and is bound
    to the frontend's own cores."""
    bound: set[int] = set()
    for child in (parent or psutil.Process()).children(recursive=True):
        if not _is_engine(child):
            continue
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


@contextmanager
def engine_session_announced(niceness: int) -> Iterator[None]:
    """While the engine's processes start: its core is to take a session of its own whose
    group runs at `niceness` (`engine_session`). Only then, so that a process the server
    starts later (a test's `vllm serve`) does not inherit it."""
    if niceness == 0 or sys.platform != "linux":
        yield
        return
    with announced(SESSION_ENV, f"{os.getpid()} {niceness}"):
        yield


@contextmanager
def engine_spin_announced(spin_ms: int | None) -> Iterator[None]:
    """While the engine's processes start: their spin to be `spin_ms` (`engine_spin`);
    None leaves vLLM's."""
    if spin_ms is None:
        yield
        return
    with announced(SPIN_ENV, str(spin_ms / 1000)):
        yield


def engine_spin(seconds: float) -> bool:
    """The busy-wait of every vLLM shared-memory queue this process reads from then on:
    `seconds` after the last message instead of vLLM's second. False, and vLLM's left as
    it is, when its `SpinCondition` no longer takes the default this was written for."""
    from vllm.distributed.device_communicators import shm_broadcast

    init = shm_broadcast.SpinCondition.__init__
    if init.__defaults__ != (_VLLM_SPIN_S,):
        logger.warning("vLLM's SpinCondition changed; --engine-spin-ms is not applied")
        return False
    init.__defaults__ = (seconds,)
    return True


def _nice_autogroup(niceness: str) -> bool:
    """Set this session's group (autogroup) to `niceness`; False on a kernel without them.
    Without CAP_SYS_ADMIN the kernel takes one such write a tenth of a second host-wide and
    refuses the others with EAGAIN (another engine starting beside this one), so a refusal
    is tried again a few times."""
    for _ in range(_AUTOGROUP_TRIES):
        try:
            Path("/proc/self/autogroup").write_text(niceness)
            return True
        except BlockingIOError:
            time.sleep(0.11)
        except OSError:
            return False
    return False


def engine_session() -> None:
    """vLLM's general plugin: in every engine process of a server that announced it (its
    engine core and the core's workers, as each starts), the starting thread at the
    announced niceness, so that every thread it starts from then on is born at it (the
    sweep after startup, `renice_engine`, can miss a thread started while it walks);
    in the engine core (the server's child, before it starts its workers, which join it)
    also `own_session`. The server itself, and any process started without the
    announcement, are left alone. The engine's spin too, when announced (`engine_spin`)."""
    spin = os.environ.get(SPIN_ENV)
    if spin:
        engine_spin(float(spin))
    server, _, niceness = os.environ.get(SESSION_ENV, "").partition(" ")
    if not niceness or os.getpid() == int(server):
        return
    os.setpriority(os.PRIO_PROCESS, 0, int(niceness))  # this thread: Linux nices threads
    if os.getppid() != int(server):
        return
    own_session(int(niceness), int(server), "the engine core")


def own_session(niceness: int, server: int, who: str) -> None:
    """This process, a child of `server`, out of the server's session into one of its own
    whose group (autogroup) runs at `niceness`, so that it gives way to every other
    session on the host, the server's included (a niceness weighs only within a group).
    Out of the server's session and process group it no longer gets the signals sent to
    them, so first it asks the kernel for SIGTERM when the server's thread that started
    it ends: it ends with the server, however the server ends. Used by the engine core
    (`engine_session`) and the body worker's children (`app.routes.body_worker`); `who`
    names it in the log."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != server:  # the server ended before the kernel could tell
        signal.raise_signal(signal.SIGTERM)
        return
    try:
        os.setsid()
    except OSError:  # a process group's leader already: it stays where it is
        logger.warning("%s could not take a session of its own", who)
        return
    if not _nice_autogroup(str(niceness)):
        logger.info("%s in a session of its own (no autogroup to nice)", who)
        return
    logger.info("%s in a session of its own, its group at niceness %s", who, niceness)


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
