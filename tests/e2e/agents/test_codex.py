"""The Codex CLI (npm `@openai/codex`, pinned and installed by scripts/setup) completing a
turn against Switchboard's Responses API, as a user points it at a self-hosted model: a
model provider with `wire_api = "responses"` and the server's base URL.

Its request is what Codex sends on every turn: a ~15k-token prompt (developer messages,
the user's environment, a dozen function tools, a `namespace` tool of sub-agent
functions, the hosted `web_search` tool), `reasoning`, `include:
["reasoning.encrypted_content"]`, `store: false`, `client_metadata`, streamed; Codex reads
the stream's events and needs `response.completed` to finish the turn. The CLI runs once
in the suite.

It fails if the CLI exits with an error (an error status, an error event, a stream it
cannot read, a turn that does not complete), or if its prompt did not reach the engine
whole (Codex reports the tokens the server counted).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, LiveServer

pytestmark = pytest.mark.e2e

CODEX = ROOT / ".cache" / "npm" / "codex" / "node_modules" / ".bin" / "codex"
MIN_PROMPT_TOKENS = 12_000  # Codex 0.169's own prompt is 14.9k of the tiny tokenizer's tokens


def _admitted(live: LiveServer) -> float:
    metrics = httpx.get(f"{live.base_url}/metrics", timeout=30).text
    found = re.search(r'^switchboard_admitted_total\{protocol="responses"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_codex_completes_a_turn(long_server: LiveServer, tmp_path: Path) -> None:
    assert CODEX.exists(), "scripts/setup installs the Codex CLI under .cache/npm/codex"
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    last = tmp_path / "last-message.txt"
    base = f"{long_server.base_url}/v1"
    provider = f'{{name = "Switchboard", base_url = "{base}", wire_api = "responses"}}'
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),  # no settings, credentials or history of the machine's user
        "CODEX_HOME": str(home),
    }
    before = _admitted(long_server)
    command = [
        str(CODEX), "exec",
        "--skip-git-repo-check", "--ephemeral",
        "--sandbox", "read-only",
        "--color", "never",
        "-c", "model_provider=switchboard",
        "-c", f"model_providers.switchboard={provider}",
        "-m", long_server.model,
        "-o", str(last),
        "Say hello.",
    ]  # fmt: skip
    # Its own process group, ended with it: anything the CLI leaves behind would otherwise
    # outlive the test, on this process's cores (tests/engine/test_cpu_host.py reads the
    # cores of every child as an engine's).
    process = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    # Codex's own error lines; the random reply may well hold the word (its tokenizer
    # learned the logging module's sources).
    assert not re.search(r"^ERROR: ", output, re.M), output[-4000:]
    used = re.search(r"tokens used\s*\n\s*([\d,]+)", output)
    assert used, output[-2000:]
    assert int(used.group(1).replace(",", "")) >= MIN_PROMPT_TOKENS
    assert last.is_file()
    assert _admitted(long_server) >= before + 1
