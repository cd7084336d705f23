"""Settings, the CLI flags generated from them, and the deployment files that name ports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from app.cli import _settings_parser
from app.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_has_a_flag_and_a_description() -> None:
    parser = _settings_parser()
    flags = {a.dest for a in parser._actions}
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description"
        if name != "engine_args":
            assert name in flags


def test_flags_parse_into_settings_and_leave_engine_flags() -> None:
    known, rest = _settings_parser().parse_known_args(
        [
            "--model",
            "m",
            "--port",
            "9001",
            "--lora-modules",
            "a=/x",
            "b=/y",
            "--max-model-len",
            "512",
            "--api-key",
            "k",
        ]
    )
    given = {k: v for k, v in vars(known).items() if v is not None and k != "help"}
    settings = Settings(**given)
    assert settings.port == 9001
    assert settings.lora_pairs() == [("a", "/x"), ("b", "/y")]
    assert settings.api_key == "k"
    assert settings.model_name == "m"
    assert rest == ["--max-model-len", "512"]


def test_bad_lora_module_is_rejected() -> None:
    with pytest.raises(ValidationError):
        Settings(model="m", lora_modules=["no-equals-sign"])


def test_environment_fills_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_MODEL", "from-env")
    monkeypatch.setenv("SWITCHBOARD_SALIENCE_MAX_SESSIONS", "3")
    settings = Settings()  # type: ignore[call-arg]
    assert settings.model == "from-env" and settings.salience_max_sessions == 3


def test_prometheus_scrapes_the_compose_service() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    job = prometheus["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    host, port = job["static_configs"][0]["targets"][0].split(":")
    assert host in compose["services"]
    assert f"{port}:{port}" in compose["services"][host]["ports"]


def test_the_evergreen_file_root_must_be_a_directory(tmp_path: Path) -> None:
    assert Settings(model="m", evergreen_file_root=tmp_path).evergreen_file_root == tmp_path
    with pytest.raises(ValidationError, match="not a directory"):
        Settings(model="m", evergreen_file_root=tmp_path / "missing")


def test_a_bad_concept_file_ends_serve_with_one_line_and_a_nonzero_status(
    tmp_path: Path,
) -> None:
    """A start-up ConfigError is the operator's: one line on stderr, no traceback, and no
    engine started for it."""
    bad = tmp_path / "concepts.safetensors"
    bad.write_bytes(b"not a safetensors file")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--model", "unused", "--readout-concepts", bad],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    ours = [line for line in done.stderr.splitlines() if line.startswith("switchboard")]
    assert len(ours) == 1
    assert ours[0].startswith(f"switchboard serve: error: cannot read the concept file {bad}: ")
