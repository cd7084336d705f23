"""Where Switchboard stands against its peers on the Responses API as today's agents use it:
the Open Responses compliance suite (its 17 tests, ported in tests/open_responses.py) and a
Codex CLI turn, against `switchboard serve`, `vllm serve`, and vLLM's stateful Responses
gateway `agentic-api` 0.9.0 (`agentic-server --llm-api-base URL/v1 --db-url sqlite://...`,
from its own venv, .venv-agentic, made by scripts/setup) in front of `vllm serve`.

Every target serves the same tiny models with the same flags, one server (or gateway and
server) alive at a time: the tiny model that ends its turns (the suite and Codex send no
output limit), with the context Codex's ~15k-token prompt needs, for every test but the
image test, which runs on the tiny vision-language model. Flags of both engines: the
reference of issue 31, `--enable-auto-tool-choice --tool-call-parser hermes
--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'`.

A test passes as the suite judges it (every response and event against the spec's
schemas, then the test's checks); the table says why one failed, in the suite's first
words for it. Tool Calling is the model's choice, which a random model makes by chance
only (docs/responses.md): no target is expected to pass it. The Codex turn passes when
`codex exec` finishes a turn (exit 0, no error of its own), as tests/e2e/agents/
test_codex.py asks; over HTTP (`wire_api = "responses"`) for every target.

Writes bench/results/open_responses.json and the table between the `bench:open_responses`
markers (docs/responses.md).

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/open_responses.py [--republish]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import harness
import httpx
from harness import PY, ROOT, markdown_table, publish

sys.path.insert(0, str(ROOT))

from tests.open_responses import TESTS, Target, run

AGENT_MODEL = ROOT / ".cache" / "tiny-agent-model"  # the tests' (tests/e2e/agents)
VL_MODEL = ROOT / ".cache" / "tiny-vl-model"
CONTEXT = "24576"  # Codex's prompt runs to ~15k tokens
FLAGS = harness.TOOL_FLAGS
VL_FLAGS = ("--max-model-len", "512", "--enforce-eager")
AGENTIC = ROOT / ".venv-agentic" / "bin" / "agentic-server"
CODEX = ROOT / ".cache" / "npm" / "codex" / "node_modules" / ".bin" / "codex"
PORT, GATEWAY_PORT = harness.PORT, harness.PORT + 1
IMAGE = "image-input"


def _models() -> None:
    """The tiny models, built as the tests build them (on first use)."""
    harness.tiny_model(AGENT_MODEL, "--max-position-embeddings", "65536", "--ends-turns")
    if not (VL_MODEL / "config.json").is_file():
        subprocess.run([PY, "-m", "app.cli", "make-tiny-vl-model", str(VL_MODEL)], check=True)


def _switchboard(model: Path, *flags: str) -> harness.Target:
    argv = (PY, "-m", "app.cli", "serve", "--model", str(model), "--served-model-name", "tiny")
    argv += ("--port", "{port}", "--grpc-port", "{grpc_port}", "--log-level", "warning")
    store = ("--responses-store", tempfile.mktemp(prefix="open_responses-", suffix=".sqlite3"))
    return harness.Target("switchboard", (*argv, "--dtype", "float32", *store, *flags))


def _vllm(model: Path, *flags: str) -> harness.Target:
    argv = (PY, str(ROOT / "bench" / "vllm_serve.py"), "serve", str(model))
    argv += ("--served-model-name", "tiny", "--port", "{port}", "--dtype", "float32")
    return harness.Target("vllm serve", (*argv, "--uvicorn-log-level", "warning", *flags))


@contextmanager
def _gateway(upstream: str, logs: Path) -> Iterator[str]:
    """agentic-server in front of `upstream` (its own SQLite store); its /v1 base URL."""
    db = logs / "agentic.sqlite3"
    command = [
        str(AGENTIC), "--llm-api-base", f"{upstream}/v1", "--db-url", f"sqlite://{db}?mode=rwc",
        "--gateway-host", "127.0.0.1", "--gateway-port", str(GATEWAY_PORT),
    ]  # fmt: skip
    log = (logs / "agentic.log").open("wb")
    env = {**os.environ, "OPENAI_API_KEY": "unused"}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{GATEWAY_PORT}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"agentic-server exited; see {logs / 'agentic.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code < 500:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"agentic-server did not start; see {logs / 'agentic.log'}")
            time.sleep(1)
        yield f"{base}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _codex_turn(base: str, logs: Path) -> dict[str, Any]:
    """One `codex exec` turn against `base` (a /v1 URL), as tests/e2e/agents/test_codex.py
    runs it; whether it finished, and why not."""
    home, work = Path(tempfile.mkdtemp(dir=logs)), Path(tempfile.mkdtemp(dir=logs))
    provider = f'{{name = "peer", base_url = "{base}", wire_api = "responses"}}'
    command = [
        str(CODEX), "exec", "--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only",
        "--color", "never", "-c", "model_provider=peer", "-c", f"model_providers.peer={provider}",
        "-m", "tiny", "Say hello.",
    ]  # fmt: skip
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
    }
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=work, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"passed": False, "why": "no turn in 900 s", "s": 900.0}
    output = done.stdout + done.stderr
    (logs / "codex.log").write_text(output)
    errors = re.findall(r"^ERROR: (.*)$", output, re.M)
    passed = done.returncode == 0 and not errors
    why = "" if passed else (errors[0] if errors else f"exit {done.returncode}")
    return {"passed": passed, "why": why[:160], "s": time.monotonic() - started}


def _suite(base: str, ids: list[str]) -> dict[str, Any]:
    out = {}
    for test_id in ids:
        outcome = run(Target(base, "tiny"), test_id)
        out[test_id] = {"passed": outcome.passed, "errors": outcome.errors[:5]}
        print(f"  {'PASS' if outcome.passed else 'FAIL'} {test_id}", flush=True)
    return out


def _measure(name: str, target: Callable[..., harness.Target], gateway: bool, logs: Path) -> Any:
    """One target: the suite and a Codex turn on the agent model, the image test on the
    vision-language model."""
    figures: dict[str, Any] = {}
    for model, flags, ids in (
        (AGENT_MODEL, ("--max-model-len", CONTEXT, *FLAGS), [t for t in TESTS if t != IMAGE]),
        (VL_MODEL, VL_FLAGS, [IMAGE]),
    ):
        print(f"{name} on {model.name}", flush=True)
        log = logs / f"{name.replace(' ', '-')}-{model.name}.log"
        with (
            harness.started(target(model, *flags), log, port=PORT) as server,
            _gateway(server.url, logs) if gateway else contextlib.nullcontext() as via,
        ):
            base = via or f"{server.url}/v1"
            figures.update(_suite(base, ids))
            if model == AGENT_MODEL:
                figures["codex"] = _codex_turn(base, logs)
    return figures


def _table(targets: dict[str, Any]) -> str:
    names = list(targets)
    rows: list[list[object]] = []
    for test_id in [*TESTS, "codex"]:
        row: list[object] = [test_id if test_id != "codex" else "Codex CLI turn (HTTP)"]
        for name in names:
            result = targets[name][test_id]
            why = result.get("why") or "; ".join(result.get("errors") or ())
            row.append("pass" if result["passed"] else f"fail: {why[:90]}")
        rows.append(row)
    totals: list[object] = ["**suite passed**"]
    for name in names:
        passed = sum(targets[name][t]["passed"] for t in TESTS)
        totals.append(f"**{passed}/{len(TESTS)}**")
    rows.append(totals)
    return "\n".join(markdown_table(["test", *names], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--republish", action="store_true", help="the table again, from bench/results"
    )
    if parser.parse_args().republish:
        targets = json.loads((harness.RESULTS / "open_responses.json").read_text())["targets"]
        harness.write_table("open_responses", _table(targets))
        return
    _models()
    logs = Path(tempfile.mkdtemp(prefix="open_responses-"))
    print(f"logs in {logs}", flush=True)
    targets = {
        "switchboard": _measure("switchboard", _switchboard, False, logs),
        "vllm serve": _measure("vllm serve", _vllm, False, logs),
        "agentic-api + vllm serve": _measure("agentic-api", _vllm, True, logs),
    }
    publish("open_responses", {"targets": targets}, _table(targets))


if __name__ == "__main__":
    main()
