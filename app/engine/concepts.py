"""Concept files for Salience readouts: directions to project hidden states on.

Format: a safetensors file with
- `directions`: float32 [n_layers, n_concepts, hidden_size], one direction per concept
  per layer (used as given: scale them as you want the readout scaled);
- `layers`: int64 [n_layers], the decoder layer after which the residual stream is read;
- metadata `concepts`: a JSON list of the n_concepts concept names.

A readout at one position is then float32 [n_layers][n_concepts]: for each layer, the
residual stream after that layer (hidden + residual, before the final norm) dotted with
each concept's direction. `make_random_concepts` writes a random file for a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from app.errors import ConfigError


@dataclass(frozen=True)
class Concepts:
    names: tuple[str, ...]
    layers: tuple[int, ...]
    directions: np.ndarray  # float32 [n_layers, n_concepts, hidden_size]

    @property
    def hidden_size(self) -> int:
        return int(self.directions.shape[2])

    def check_model(self, hidden_size: int, num_layers: int) -> None:
        """The file fits a model of `num_layers` decoder layers of `hidden_size`."""
        if self.hidden_size != hidden_size:
            raise ConfigError(
                f"concept directions are {self.hidden_size} wide; the model's hidden size "
                f"is {hidden_size}"
            )
        missing = [layer for layer in self.layers if not 0 <= layer < num_layers]
        if missing:
            raise ConfigError(
                f"concept layers {missing} do not exist; the model has {num_layers} layers"
            )


def load_concepts(path: str | Path) -> Concepts:
    """The concepts in `path`; a file that is not one is a `ConfigError` (it is given at
    start-up by the operator, never by a client)."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise ConfigError(f"cannot read the concept file {path}: {exc}") from exc
    try:
        names = tuple(str(n) for n in json.loads(metadata["concepts"]))
        directions = np.ascontiguousarray(tensors["directions"], dtype=np.float32)
        layers = tuple(int(x) for x in tensors["layers"].tolist())
    except KeyError as exc:
        raise ConfigError(f"{path} is not a concept file: it has no {exc}") from exc
    except (ValueError, TypeError) as exc:  # of json and numpy, on the file's contents
        raise ConfigError(f"{path} is not a concept file: {exc}") from exc
    if not layers or not names:
        raise ConfigError(f"{path}: a concept file needs at least one layer and one concept")
    if directions.ndim != 3 or directions.shape[:2] != (len(layers), len(names)):
        raise ConfigError(
            f"{path}: directions {directions.shape} do not match "
            f"{len(layers)} layers x {len(names)} concepts"
        )
    return Concepts(names=names, layers=layers, directions=directions)


def make_random_concepts(
    model_dir: Path,
    out: Path,
    *,
    layers: tuple[int, ...] | None = None,
    n_concepts: int = 4,
    seed: int = 0,
) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    chosen = layers if layers is not None else tuple(range(int(config["num_hidden_layers"])))
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((len(chosen), n_concepts, hidden)).astype(np.float32)
    directions /= np.linalg.norm(directions, axis=2, keepdims=True)
    names = [f"concept_{i}" for i in range(n_concepts)]
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {"directions": directions, "layers": np.asarray(chosen, dtype=np.int64)},
        str(out),
        metadata={"concepts": json.dumps(names)},
    )
    return out
