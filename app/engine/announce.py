"""What the server tells the engine's processes as they start: a variable in this
process's environment while they are started, and only then, so that a process the server
starts later (a test's `vllm serve`, a tool) does not inherit it. vLLM's general plugins
(`app.engine.vllm.hold`, `app.engine.cpu_host.engine_session`) read it in each new
engine process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def announced(name: str, value: str) -> Iterator[None]:
    """`name=value` in the environment for the block."""
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
