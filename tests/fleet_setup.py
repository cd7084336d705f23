"""The suite's one fleet (tests/fleet/): two real `switchboard serve` replicas of the tiny
model sharing a real redis-server, behind vLLM's router (round robin), SMG (round robin)
in its HTTP mode and in its gRPC mode (the replicas' `vllm.grpc.engine.VllmEngine`), and
nginx (websockets, gRPC), built by `app.fleet` exactly as `switchboard fleet` builds
one.

It is launched in the background when the unit tests begin (`tests/conftest.py`): they
run on a fake engine and leave a core idle, so the replicas' engines start meanwhile, and
the fleet's tests, which run last, find them ready (`started`). Its replicas take the
flags of the suite's live server (tools, structured outputs, a LoRA adapter) and those of
the drain test (an 8k context, a grace period past its drain); a prompt bound small
enough that one call can be refused on purpose; every tool's arguments constrained to
its schema (vLLM's router forwards chat tools without their `strict`). Replicas and
routers are traced to the suite's OTLP receiver (tests/otlp_receiver.py).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from app.fleet.fleet import Fleet, RouterSpec
from app.fleet.routers import SMG, SMG_GRPC, VLLM_ROUTER, Probe
from tests.conftest import ENGINE_SPIN_MS, LIVE_LORA, LIVE_MODEL, tiny_lora_path, tiny_model_path
from tests.otlp_receiver import session_receiver

CONTEXT = 8192
# The replicas drain as a user's would, for serve's 25 s: a drain cuts what outlasts it,
# and a short stream in flight at the roll's SIGTERM, on an engine the other lane starved
# of CPU, once took over 6 s (CI). Replica 0 comes back from the roll with the drain
# test's, whose long streams it cuts (tests/fleet/test_drain.py drains it for good).
DRAIN_TIMEOUT_S = 4.0
# Past the drain test's drain, so that the grace, not the drain, decides when a listener
# closes, and past the routers' probes (PROBE.out_within_s).
GRACE_S = 6.0
PROBE = Probe(interval_s=1, failures=2, successes=1, timeout_s=2)
# A call of 2 choices of a prompt over half of it is refused by every replica.
MAX_QUEUED_TOKENS = 4096

_fleet: Fleet | None = None


def _serve_args() -> list[str]:
    structured = {"backend": "xgrammar", "disable_any_whitespace": True}
    return [
        "--model", str(tiny_model_path(CONTEXT)),
        "--served-model-name", LIVE_MODEL,
        "--dtype", "float32",
        "--max-model-len", str(CONTEXT),
        # No torch.compile: from an empty compile cache (CI's) each start compiled for
        # ~30 s of a core, restarts included, and the eager model steps no slower here.
        "--enforce-eager",
        "--lora-modules", f"{LIVE_LORA}={tiny_lora_path()}",
        "--max-loras", "2",
        "--max-lora-rank", "8",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        # vllm-router drops `strict` from chat tools (docs/operations.md): every tool's
        # arguments follow its schema, marked strict or not.
        "--tool-strict-level", "parameter",
        "--structured-outputs-config", json.dumps(structured),
        "--max-queued-tokens", str(MAX_QUEUED_TOKENS),
        "--salience-lease-s", "1",
        # Batches go on beside the roll's load (tests/fleet/test_rolling_restart.py). A
        # dead replica's batches and background responses are taken over once its leases
        # run out, at the default 10 s: a replica the suite's other lane starves of CPU
        # may miss a renewal of a shorter one while it is alive.
        "--batch-busy-running", "2",
        # No replica meets a prompt of over a MiB: the render process would be vLLM's
        # import again at each of the fleet's four starts (~16 s of CPU each) for nothing.
        "--render-process", "false",
        # The engines give way to everything else (their spinning included): a replica
        # restarting beside the other's spinning under the roll's load took minutes to
        # import vLLM at the default niceness (10).
        "--engine-niceness", "19",
        "--engine-spin-ms", str(ENGINE_SPIN_MS),
        "--log-level", "warning",
    ]  # fmt: skip


def launch() -> Fleet:
    """The fleet, its replicas starting (idempotent)."""
    global _fleet
    if _fleet is None:
        workdir = Path(tempfile.mkdtemp(prefix="switchboard-fleet-"))
        _fleet = Fleet(
            workdir=workdir,
            serve_args=_serve_args(),
            count=2,
            routers={
                "vllm-router": RouterSpec(VLLM_ROUTER, "round_robin"),
                "smg": RouterSpec(SMG, "round_robin"),
                "smg-grpc": RouterSpec(SMG_GRPC, "round_robin"),
            },
            nginx=True,
            probe=PROBE,
            drain_grace_s=GRACE_S,
            # As a user's replicas would: no KV-cache size set, so serve picks its own on
            # a CPU host, on a page cache the suite has filled.
            replica_env={"VLLM_CPU_KVCACHE_SPACE": None},
            otlp_traces_endpoint=session_receiver().endpoint,
        )
        _fleet.launch()
    return _fleet


def started() -> Fleet:
    fleet = launch()
    fleet.start()
    return fleet


def stop() -> None:
    """Stop the fleet if it was launched (the session's end)."""
    global _fleet
    if _fleet is not None:
        _fleet.stop()
        _fleet = None


# The fleet's test modules, in the order they run: those that need every replica as it
# started first; then the rolling restart and the death; then replica 0's drain.
MODULES = [
    "test_openai_through_router",
    "test_smg",
    "test_smg_grpc",
    "test_traces",
    "test_sessions",
    "test_responses_replicas",
    "test_kv_aware",
    "test_rolling_restart",
    "test_drain",  # replica 0, for good
]
