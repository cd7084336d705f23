"""The start-up files `Settings` names, checked without vLLM: the concept file and the
static LoRA adapters' directories.

`start_engine` runs these checks before it starts an engine, and `switchboard serve` before
it parses vLLM's own flags, which imports vLLM (some 20 s): a bad file ends the command
with one line at once. Each failure is a `ConfigError`."""

from __future__ import annotations

import os

from app.config import Settings
from app.engine.concepts import Concepts, load_concepts
from app.errors import ConfigError


def check_files(settings: Settings) -> Concepts | None:
    """The concepts `settings` names, if any, read; every LoRA directory it names there."""
    concepts = None
    if settings.readout_concepts is not None:
        concepts = load_concepts(settings.readout_concepts)
    for name, path in settings.lora_pairs():
        if not os.path.isdir(path):
            raise ConfigError(f"--lora-modules {name}={path}: no such directory")
    return concepts
