"""The Codex CLI (npm `@openai/codex`, pinned and installed by scripts/setup) completing a
turn against Switchboard's Responses API, as a user points it at a self-hosted model: a
model provider with `wire_api = "responses"` and the server's base URL; over HTTP, and
over the websocket mode (the provider marked `supports_websockets = true`: Codex opens
`ws://.../v1/responses`, warms up with `generate: false`, then sends its turn continuing
from the warm-up with `previous_response_id`, on one connection).

Its request is what Codex sends on every turn: a ~15k-token prompt (developer messages,
the user's environment, a dozen function tools, a `namespace` tool of sub-agent
functions, the hosted `web_search` tool), `reasoning`, `include:
["reasoning.encrypted_content"]`, `store: false`, `client_metadata`, streamed; Codex reads
the stream's events and needs `response.completed` to finish the turn. The CLI runs once
in the suite.

It fails if the CLI exits with an error (an error status, an error event, a stream it
cannot read, a turn that does not complete), or if its prompt did not reach the engine
whole (vLLM counts the prompt tokens it was given); over the websocket, if Codex fell
back to HTTP (it says so, and the server counts its HTTP calls to /v1/responses).
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


def _counts(live: LiveServer) -> tuple[float, float, float]:
    """(Responses calls admitted, HTTP calls to POST /v1/responses, prompt tokens the
    engine was given: vLLM's count, prefix-cache hits included)."""
    metrics = httpx.get(f"{live.base_url}/metrics", timeout=30).text

    def total(pattern: str) -> float:
        return sum(float(n) for n in re.findall(f"^{pattern} (\\S+)$", metrics, re.M))

    return (
        total(r'switchboard_admitted_total\{protocol="responses"\}'),
        total(r'http_requests_total\{handler="/v1/responses",method="POST",status="\w+"\}'),
        total(r"vllm:prompt_tokens_total\{[^}]*\}"),
    )


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_codex_completes_a_turn(long_server: LiveServer, tmp_path: Path, transport: str) -> None:
    assert CODEX.exists(), "scripts/setup installs the Codex CLI under .cache/npm/codex"
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    last = tmp_path / "last-message.txt"
    base = f"{long_server.base_url}/v1"
    websockets = "true" if transport == "websocket" else "false"
    provider = (
        f'{{name = "Switchboard", base_url = "{base}", wire_api = "responses", '
        f"supports_websockets = {websockets}}}"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),  # no settings, credentials or history of the machine's user
        "CODEX_HOME": str(home),
    }
    admitted, posts, prompted = _counts(long_server)
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
    assert re.search(r"tokens used\s*\n\s*[\d,]+", output), output[-2000:]
    assert last.is_file()
    admitted_after, posts_after, prompted_after = _counts(long_server)
    assert admitted_after >= admitted + 1
    # Codex's own count leaves out what the prefix cache held (its prompt's first 6k
    # tokens, after the other transport's turn): the engine's counts them all.
    assert prompted_after - prompted >= MIN_PROMPT_TOKENS
    if transport == "websocket":
        assert "Falling back" not in output, output[-4000:]
        assert posts_after == posts  # every call went over the websocket
    else:
        assert posts_after >= posts + 1
