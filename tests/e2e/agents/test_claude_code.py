"""The Claude Code CLI (npm `@anthropic-ai/claude-code`, pinned and installed by
scripts/setup) completing a turn against Switchboard's Messages API, as a user points it
at a self-hosted model: `ANTHROPIC_BASE_URL` at the server, its haiku/sonnet/opus model
names at the served model.

Its request is what Claude Code sends on every turn: a ~20k-token prompt (system blocks
with `cache_control` and its billing header, a dozen tools with JSON schemas, inline
system messages), `thinking`, `context_management`, beta headers, `?beta=true`, streamed.
A random model rarely stops, so the turn ends on `max_tokens` (capped low with
`CLAUDE_CODE_MAX_OUTPUT_TOKENS` to keep the test short): that is the model's length, not
a wire error. The CLI runs once in the suite.

It fails if the CLI reports an API error other than the model's length (an error
status, an error event, a stream it cannot read), or if its prompt did not reach the
engine whole.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, LiveServer

pytestmark = pytest.mark.e2e

CLAUDE = ROOT / ".cache" / "npm" / "claude-code" / "node_modules" / ".bin" / "claude"


def _admitted(live: LiveServer) -> float:
    metrics = httpx.get(f"{live.base_url}/metrics", timeout=30).text
    found = re.search(r'^switchboard_admitted_total\{protocol="anthropic"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_claude_code_completes_a_turn(long_server: LiveServer, tmp_path: Path) -> None:
    assert CLAUDE.exists(), "scripts/setup installs the Claude Code CLI under .cache/npm"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    model = long_server.model
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),  # no settings, credentials or history of the machine's user
        "ANTHROPIC_BASE_URL": long_server.base_url,
        "ANTHROPIC_API_KEY": "sk-switchboard",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "48",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    before = _admitted(long_server)
    run = subprocess.run(
        [str(CLAUDE), "-p", "Say hello.", "--output-format", "json"],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        result = json.loads(run.stdout)
    except ValueError as exc:
        raise AssertionError(
            f"exit {run.returncode}: {run.stdout[-2000:]} {run.stderr[-2000:]}"
        ) from exc
    assert result["type"] == "result" and result["subtype"] == "success", result
    assert result["api_error_status"] is None, result  # no error status from the server
    if result["is_error"]:
        # Claude Code reports a reply cut at max_tokens (after asking the model to go on a
        # few times) as "API Error: Claude's response exceeded the ... output token
        # maximum", exit status 1: the model's length, not the wire.
        assert result["api_error"] == "max_output_tokens", result
    else:
        assert run.returncode == 0, run.stderr[-2000:]
    usage = result["usage"]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert prompt > 10_000, usage  # Claude Code's own prompt, tools and all
    assert usage["output_tokens"] >= 1, usage
    assert _admitted(long_server) >= before + 1
    assert long_server.wait_idle() == 0
