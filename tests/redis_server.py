"""A real `redis-server` (Debian's package, installed by scripts/setup) for the tests that
share a response store: started on a free loopback port with no persistence, stopped
with the fixture that started it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import free_port

START_TIMEOUT = 30.0


@contextmanager
def redis_server(workdir: Path, *extra: str) -> Iterator[str]:
    """A fresh redis-server; yields its URL."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed: run scripts/setup"
    port = free_port()
    command = [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
        *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not listen in time"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
