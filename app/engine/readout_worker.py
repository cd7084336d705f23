"""Readout capture inside vLLM's worker (mixed into the worker as `worker_extension_cls`).

Forward hooks on the configured decoder layers read the residual stream (vLLM's Llama-
style layers return `(hidden, residual)` with the add fused into the next norm, so the
stream after layer i is their sum), keep only the rows of requests that asked for
readouts at those positions, and project them on the concept directions right here, so
only n_layers x n_concepts floats per position ever leave the worker.

Which positions a request wants travels in its SamplingParams' `extra_args`
(`READOUT_KEY`: list of [start, end) ranges, `READOUT_ID_KEY`: the frontend's request id,
since vLLM suffixes request ids inside the engine). The flattened batch maps back to
requests through `input_batch.req_ids`, `query_start_loc` and `positions`, which holds
for prefill chunks and decode tokens in the same step alike.

Invariants: a batch in which no request wants readouts costs one scan of the batch's
request ids per forward pass and nothing per layer; captured vectors wait in
`_readout_store` until the frontend takes them (`readout_take`, many requests per call)
or drops them (`readout_drop`, on abort).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from app.engine.concepts import load_concepts

READOUT_KEY = "switchboard_readout_ranges"
READOUT_ID_KEY = "switchboard_request_id"


class _Plan:
    """The rows of one forward pass that need readouts, and where they go."""

    __slots__ = ("keys", "positions", "rows")

    def __init__(self, rows: torch.Tensor, keys: list[str], positions: list[int]) -> None:
        self.rows = rows
        self.keys = keys
        self.positions = positions


class ReadoutWorkerExtension:
    """Methods callable through `AsyncLLM.collective_rpc`; `self` is vLLM's worker."""

    model_runner: Any

    def readout_setup(self, path: str) -> dict[str, Any]:
        concepts = load_concepts(path)
        model = self.model_runner.get_model()
        decoder_layers = model.model.layers
        self._readout_dirs = [
            torch.from_numpy(concepts.directions[i].T.copy()) for i in range(len(concepts.layers))
        ]
        self._readout_n_layers = len(concepts.layers)
        self._readout_n_concepts = len(concepts.names)
        self._readout_store: dict[str, dict[int, np.ndarray]] = {}
        self._readout_plan: _Plan | None = None
        first = min(concepts.layers)
        for index, layer in enumerate(concepts.layers):
            if layer >= len(decoder_layers):
                raise ValueError(f"layer {layer} does not exist ({len(decoder_layers)} layers)")
            decoder_layers[layer].register_forward_hook(
                self._readout_hook(index, is_first=layer == first)
            )
        return {"hidden_size": int(concepts.hidden_size), "layers": list(concepts.layers)}

    def _readout_make_plan(self) -> _Plan | None:
        runner = self.model_runner
        req_ids = runner.input_batch.req_ids
        wanted: list[tuple[int, str, list[list[int]]]] = []
        for i, req_id in enumerate(req_ids):
            state = runner.requests.get(req_id)
            params = getattr(state, "sampling_params", None)
            extra = getattr(params, "extra_args", None)
            if extra and READOUT_KEY in extra:
                wanted.append((i, str(extra[READOUT_ID_KEY]), extra[READOUT_KEY]))
        if not wanted:
            return None
        n = len(req_ids)
        starts = runner.query_start_loc.np[: n + 1]
        positions = runner.positions[: int(starts[n])].cpu().numpy()
        rows: list[int] = []
        keys: list[str] = []
        kept: list[int] = []
        for i, key, ranges in wanted:
            lo, hi = int(starts[i]), int(starts[i + 1])
            span = positions[lo:hi]
            mask = np.zeros(hi - lo, dtype=bool)
            for start, end in ranges:
                mask |= (span >= start) & (span < end)
            for offset in np.nonzero(mask)[0]:
                rows.append(lo + int(offset))
                keys.append(key)
                kept.append(int(span[offset]))
        if not rows:
            return None
        return _Plan(torch.tensor(rows, dtype=torch.long), keys, kept)

    def _readout_hook(self, index: int, *, is_first: bool) -> Any:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            if is_first:
                self._readout_plan = self._readout_make_plan()
            plan = self._readout_plan
            if plan is None:
                return
            if isinstance(output, tuple):
                hidden, residual = output[0], output[1]
                stream = hidden[plan.rows] + (residual[plan.rows] if residual is not None else 0)
            else:
                stream = output[plan.rows]
            projected = (stream.float() @ self._readout_dirs[index]).numpy()
            for row, (key, position) in enumerate(zip(plan.keys, plan.positions, strict=True)):
                per_request = self._readout_store.setdefault(key, {})
                vector = per_request.get(position)
                if vector is None:
                    vector = np.zeros(
                        (self._readout_n_layers, self._readout_n_concepts), dtype=np.float32
                    )
                    per_request[position] = vector
                vector[index] = projected[row]

        return hook

    def readout_take(self, keys: list[str]) -> dict[str, list[tuple[int, bytes]]]:
        """Hand over (and forget) every readout captured so far for these requests."""
        taken: dict[str, list[tuple[int, bytes]]] = {}
        for key in keys:
            captured = self._readout_store.pop(key, None)
            if captured:
                taken[key] = [(p, captured[p].tobytes()) for p in sorted(captured)]
        return taken

    def readout_drop(self, key: str) -> None:
        self._readout_store.pop(key, None)
