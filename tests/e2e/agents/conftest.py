"""The agent CLIs' server: the tiny model with a long context, for clients whose own
prompts run to 15-20k tokens (the Codex and Claude Code CLIs: their system prompts and tool
schemas). Package-scoped: it starts with the first test here and stops after the last,
so it never runs beside the image server (two idle CPU engines cost memory; two busy
ones slow each other badly).

Served as `switchboard serve` would serve it to such a client: the tiny model's
hermes-style tool calls read back (`--enable-auto-tool-choice --tool-call-parser
hermes`) and no whitespace inside constrained JSON (a random model pads it otherwise).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import CACHE, ENGINE_SPIN_MS, LiveServer, serve

LONG_MODEL = "tiny-long"
POSITIONS = 65_536
# The context served: the CLIs' prompts run to ~15k (Codex) and ~20.5k tokens (Claude
# Code).
CONTEXT = 24_576


def tiny_long_model_path() -> Path:
    """The tiny model with `POSITIONS` positions, one that ends its turns, under .cache/,
    built on first use. Codex sends no `max_output_tokens`: the default tiny model's reply
    ran to its end of sequence or the context's end (13-78 s a turn at 64k; at 24k, Codex
    failed the turn as incomplete), where this one's ends within tens of tokens."""
    from app.tiny_model import build_tiny_model

    model = CACHE / "tiny-agent-model"
    if not (model / "config.json").is_file():
        build_tiny_model(model, max_position_embeddings=POSITIONS, ends_turns=True)
    return model


@pytest.fixture(scope="package")
def long_server() -> Iterator[LiveServer]:
    from vllm.config import StructuredOutputsConfig

    from app.config import Settings

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    settings = Settings(
        model=str(tiny_long_model_path()),
        served_model_name=LONG_MODEL,
        pin_frontend=True,  # as the live server runs (tests/conftest.py)
        engine_spin_ms=ENGINE_SPIN_MS,
        render_process=False,  # no big prompt here: vLLM's import again for nothing
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        engine_args={
            "dtype": "float32",
            "max_model_len": CONTEXT,
            # Not compiled, as the live server is not (tests/fleet_setup.py says why).
            "enforce_eager": True,
            "structured_outputs_config": StructuredOutputsConfig(
                backend="xgrammar", disable_any_whitespace=True
            ),
        },
    )
    before = os.sched_getaffinity(0)
    try:
        with serve(settings, LONG_MODEL) as live:
            yield live
    finally:
        _restore_affinity(before)


def _restore_affinity(cpus: set[int]) -> None:
    """Every thread of this process back on `cpus`. Starting this server pinned them off
    its own engine's cores (`app.engine.cpu_host.pin_frontend`); left so, an engine
    started after it (the live server's, when these tests run first) would be spawned on
    those same cores and could not pin the frontend off them."""
    for thread in psutil.Process().threads():
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.sched_setaffinity(thread.id, cpus)
