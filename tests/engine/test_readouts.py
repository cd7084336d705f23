"""Readouts from inside vLLM's worker equal a plain transformers forward pass.

The reference reads the residual stream after each configured decoder layer with forward
hooks on transformers' Llama (its `hidden_states` tuple applies the final norm to the last
element, so it cannot serve for the last layer) and projects it on the same directions.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from app.engine.base import GenerationRequest, SamplingOptions
from app.engine.concepts import load_concepts
from app.errors import InvalidRequest
from tests.conftest import LiveServer, concepts_path, tiny_model_path

pytestmark = pytest.mark.engine


def reference_readouts(token_ids: list[int]) -> np.ndarray:
    """float32 [positions, n_layers, n_concepts] from transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    concepts = load_concepts(concepts_path())
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32)
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        model.model.layers[layer].register_forward_hook(
            lambda module, args, output, layer=layer: captured.__setitem__(
                layer, output[0] if isinstance(output, tuple) else output
            )
        )
        for layer in concepts.layers
    ]
    with torch.no_grad():
        model(torch.tensor([token_ids]))
    for hook in hooks:
        hook.remove()
    per_layer = [
        captured[layer][0].numpy() @ concepts.directions[i].T
        for i, layer in enumerate(concepts.layers)
    ]
    return np.stack(per_layer, axis=1)


async def _collect(engine: Any, request: GenerationRequest) -> tuple[list[int], dict[int, bytes]]:
    tokens: list[int] = []
    readouts: dict[int, bytes] = {}
    async for event in engine.generate(request):
        tokens += event.token_ids
        assert not set(readouts) & set(event.readouts or {}), "a position came twice"
        readouts.update(event.readouts or {})
    return tokens, readouts


def test_manifest(live_server: LiveServer) -> None:
    manifest = live_server.engine.info.readout
    concepts = load_concepts(concepts_path())
    assert manifest.concepts == concepts.names and manifest.layers == concepts.layers
    assert manifest.hidden_size == 128 and manifest.dtype == "float32"


def test_readouts_match_transformers_for_concurrent_requests(live_server: LiveServer) -> None:
    engine = live_server.engine
    prompts = [
        engine.tokenizer.encode(text)
        for text in ("def readout(self):", "import numpy as np\nx = np.zeros(3)", "class A:\n pass")
    ]
    # Different ranges per request: all positions; decode positions only; a prefix only.
    ranges = [((0, 10_000),), ((len(prompts[1]), 10_000),), ((0, 3),)]

    async def run_all() -> list[tuple[list[int], dict[int, bytes]]]:
        return await asyncio.gather(
            *[
                _collect(
                    engine,
                    GenerationRequest(
                        f"ro-{i}",
                        prompt_token_ids=prompt,
                        sampling=SamplingOptions(max_tokens=6, temperature=0.0, ignore_eos=True),
                        readout_ranges=ranges[i],
                    ),
                )
                for i, prompt in enumerate(prompts)
            ]
        )

    results = live_server.call(run_all())
    manifest = engine.info.readout
    shape = (len(manifest.layers), len(manifest.concepts))
    for i, (prompt, (tokens, readouts)) in enumerate(zip(prompts, results, strict=True)):
        sequence = prompt + tokens
        # The last sampled token is never fed back, so it has no hidden state.
        fed = range(len(sequence) - 1)
        ((start, end),) = ranges[i]
        assert sorted(readouts) == [p for p in fed if start <= p < end]
        reference = reference_readouts(sequence)
        for position, data in readouts.items():
            mine = np.frombuffer(data, dtype=np.float32).reshape(shape)
            np.testing.assert_allclose(mine, reference[position], rtol=1e-4, atol=1e-4)


def test_prefill_only_readouts_cover_the_prompt(live_server: LiveServer) -> None:
    engine = live_server.engine
    prompt = engine.tokenizer.encode("score this prompt")
    tokens, readouts = live_server.call(
        _collect(
            engine,
            GenerationRequest(
                "ro-prefill",
                prompt_token_ids=prompt,
                sampling=SamplingOptions(max_tokens=0),
                readout_ranges=((0, 10_000),),
            ),
        )
    )
    assert tokens == [] and sorted(readouts) == list(range(len(prompt)))


def test_bad_readout_range(live_server: LiveServer) -> None:
    with pytest.raises(InvalidRequest):
        live_server.call(
            _collect(
                live_server.engine,
                GenerationRequest("ro-bad", prompt_text="a", readout_ranges=((5, 2),)),
            )
        )
