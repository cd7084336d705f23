"""Cost of readouts: output tokens/s of the engine with readouts on no, one and all
positions, against the same engine without readouts configured at all.

One engine at a time (two CPU engines slow each other), 8 concurrent requests of a
128-token prompt and 64 output tokens each, `ignore_eos`, rounds alternating between the
plain engine and the readout engine; medians. Writes bench/results/readouts.json and the
table between the `bench:readouts` markers.

    flock /tmp/switchboard-engine.lock .venv/bin/python bench/readouts.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import harness
from harness import MODEL, ROOT, publish

CONCEPTS = ROOT / ".cache" / "tiny-concepts.safetensors"
PROMPT_LEN, OUTPUT_LEN, CONCURRENCY, REQUESTS = 128, 64, 8, 64
MODES = (
    "no readouts configured",
    "readouts on no position",
    "readouts on 1 position",
    "readouts on all positions",
)


async def _measure(with_concepts: bool) -> dict[str, float]:
    import numpy as np

    from app.config import Settings
    from app.engine.base import GenerationRequest, SamplingOptions
    from app.engine.vllm.startup import start_engine

    settings = Settings(
        model=str(MODEL),
        readout_concepts=CONCEPTS if with_concepts else None,
        engine_args={"dtype": "float32", "max_model_len": 1024},
    )
    engine = await start_engine(settings)
    rng = np.random.default_rng(0)
    options = SamplingOptions(max_tokens=OUTPUT_LEN, ignore_eos=True)

    async def one(rid: str, ranges: tuple[tuple[int, int], ...]) -> int:
        prompt = rng.integers(10, engine.info.vocab_size, PROMPT_LEN).tolist()
        count = 0
        request = GenerationRequest(
            rid, prompt_token_ids=prompt, sampling=options, readout_ranges=ranges
        )
        async for event in engine.generate(request):
            count += len(event.token_ids)
        return count

    async def load(name: str, ranges: tuple[tuple[int, int], ...]) -> float:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def gated(i: int) -> int:
            async with gate:
                return await one(f"{name}-{i}", ranges)

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*[gated(i) for i in range(REQUESTS)]))
        return tokens / (time.perf_counter() - start)

    await load("warm", ())
    results: dict[str, float] = {}
    if not with_concepts:
        results[MODES[0]] = await load("plain", ())
    else:
        results[MODES[1]] = await load("none", ())
        results[MODES[2]] = await load("one", ((PROMPT_LEN + 10, PROMPT_LEN + 11),))
        results[MODES[3]] = await load("all", ((0, 10_000),))
    engine.shutdown()
    return results


def _child(with_concepts: bool) -> dict[str, float]:
    flag = "--child-concepts" if with_concepts else "--child-plain"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    out = subprocess.run(
        [sys.executable, __file__, flag],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(out.stderr[-3000:])
    result: dict[str, float] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child-plain", action="store_true")
    parser.add_argument("--child-concepts", action="store_true")
    args = parser.parse_args()
    if args.child_plain or args.child_concepts:
        print("RESULT " + json.dumps(asyncio.run(_measure(args.child_concepts))), flush=True)
        return
    harness.tiny_model()
    if not CONCEPTS.is_file():
        subprocess.run(
            [sys.executable, "-m", "app.cli", "make-concepts", str(MODEL), str(CONCEPTS)],
            check=True,
        )
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        rounds.append({**_child(False), **_child(True)})
    median = {m: statistics.median(r[m] for r in rounds) for m in MODES}
    base = median[MODES[0]]
    lines = [
        f"{CONCURRENCY} concurrent requests, {PROMPT_LEN}-token prompts, {OUTPUT_LEN} output "
        f"tokens; engine only; medians of {args.rounds} rounds.",
        "",
        "| mode | output tok/s | vs no readouts configured |",
        "|---|---|---|",
    ]
    lines += [f"| {m} | {median[m]:.0f} | {median[m] / base:.2f}x |" for m in MODES]
    publish("readouts", {"median": median, "rounds": rounds}, "\n".join(lines))


if __name__ == "__main__":
    main()
