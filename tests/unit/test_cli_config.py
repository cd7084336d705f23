"""Settings, the CLI flags generated from them, and the deployment files that name ports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

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
    # pydantic-settings fills a required field from the environment; mypy (without its
    # plugin) sees only the field.
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


def _kubernetes() -> dict[tuple[str, str], dict[str, Any]]:
    """Every object under deploy/kubernetes/, by (kind, name)."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in objects, f"{key} twice"
                objects[key] = doc
    return objects


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _port(container: dict[str, Any], ref: int | str) -> int:
    """A container port by number or name."""
    for port in container.get("ports", ()):
        if ref in (port["containerPort"], port.get("name")):
            return int(port["containerPort"])
    raise AssertionError(f"container {container['name']} has no port {ref!r}")


def test_the_kubernetes_files_refer_to_each_other() -> None:
    """The InferencePool selects Switchboard's pods on a port they serve and names the
    picker's Service on its ext-proc port; each Service selects its Deployment's pods and
    targets ports their containers open; the picker runs as the account its RBAC binds,
    on the pool it is given, with its probes and config on ports and files it has."""
    objects = _kubernetes()
    pool = objects[("InferencePool", "switchboard")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    server = objects[("Deployment", "switchboard")]
    server_pod = server["spec"]["template"]
    (switchboard,) = server_pod["spec"]["containers"]
    labels = server_pod["metadata"]["labels"]
    assert _selects(server["spec"]["selector"]["matchLabels"], labels)
    assert _selects(pool["spec"]["selector"]["matchLabels"], labels)
    assert labels["inference.networking.k8s.io/engine-type"] == "vllm"
    for target in pool["spec"]["targetPorts"]:
        _port(switchboard, target["number"])
    assert _port(switchboard, "http") == Settings.model_fields["port"].default
    assert _port(switchboard, "grpc") == Settings.model_fields["grpc_port"].default
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        _port(switchboard, switchboard[probe]["httpGet"]["port"])
    assert switchboard["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert switchboard["livenessProbe"]["httpGet"]["path"] == "/health"
    drain = Settings.model_fields["drain_timeout_s"].default
    grace = Settings.model_fields["drain_grace_s"].default
    sleep = switchboard["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    # preStop, then the drain (its grace is within it unless longer), then the engine.
    ends = float(sleep[1]) + max(drain, grace)
    assert server_pod["spec"]["terminationGracePeriodSeconds"] >= ends + 10

    services = {name: doc for (kind, name), doc in objects.items() if kind == "Service"}
    deployments = {name: doc for (kind, name), doc in objects.items() if kind == "Deployment"}
    for name, service in services.items():
        deployment = deployments[name]
        pod = deployment["spec"]["template"]
        assert _selects(service["spec"]["selector"], pod["metadata"]["labels"]), name
        assert _selects(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert any(_port(c, target) for c in pod["spec"]["containers"]), (name, port)

    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service"
    picker_service = services[ref["name"]]
    ext_proc = next(
        p for p in picker_service["spec"]["ports"] if p["port"] == ref["port"]["number"]
    )
    assert ext_proc["name"] == "grpc-ext-proc"
    picker = deployments[ref["name"]]["spec"]["template"]["spec"]
    (epp,) = picker["containers"]
    assert _port(epp, ext_proc.get("targetPort", ext_proc["port"])) == 9002
    args = epp["args"]
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flag["--pool-name"] == pool["metadata"]["name"]
    assert flag["--pool-group"] == pool["apiVersion"].split("/")[0]
    env = {e["name"] for e in epp["env"]}
    assert flag["--pool-namespace"].removeprefix("$(").removesuffix(")") in env
    for probe in ("readinessProbe", "livenessProbe"):
        assert _port(epp, epp[probe]["grpc"]["port"]) == 9003  # the picker's health port
    mounts = {m["name"]: m["mountPath"] for m in epp["volumeMounts"]}
    (volume,) = [v for v in picker["volumes"] if v["name"] in mounts]
    config = objects[("ConfigMap", volume["configMap"]["name"])]
    directory, file = flag["--config-file"].rsplit("/", 1)
    assert mounts[volume["name"]] == directory and file in config["data"]
    assert yaml.safe_load(config["data"][file])["kind"] == "EndpointPickerConfig"

    account = picker["serviceAccountName"]
    assert ("ServiceAccount", account) in objects
    granted: set[tuple[str, str]] = set()
    for (kind, _), binding in objects.items():
        if kind in ("RoleBinding", "ClusterRoleBinding") and any(
            s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]
        ):
            role = objects[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            for rule in role["rules"]:
                for group in rule.get("apiGroups", ()):
                    for resource in rule["resources"]:
                        if {"get", "watch", "list"} <= set(rule["verbs"]):
                            granted.add((group, resource))
                        if "create" in rule["verbs"]:
                            granted.add((group, resource))
    # What the picker watches (its chart's RBAC), and its own /metrics auth.
    for needed in (
        ("inference.networking.k8s.io", "inferencepools"),
        ("inference.networking.x-k8s.io", "inferenceobjectives"),
        ("", "pods"),
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ):
        assert needed in granted, needed


def test_a_served_heap_is_frozen_and_its_young_collected_less_often() -> None:
    import gc

    from app.engine.vllm.startup import YOUNG_THRESHOLD, settle_heap

    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert before[0] < YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
