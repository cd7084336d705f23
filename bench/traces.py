"""What traces cost (issue 41): Switchboard's frontend CPU per output token at 64 streams
with tracing on (every request sampled) and off, beside the server as it was before issue
41 (goals: on at most 1.05x off; off the same as before).

Targets, one alive at a time, their order alternating from round to round:
- before: `switchboard serve` from a checkout of `BEFORE` (the main of the day the
  work began), run as this tree's own is (`python -P`, the checkout first on the path);
- off: this tree, as it starts by default (the access log on, in text);
- on: this tree with `--otlp-traces-endpoint` to an OTLP receiver in this process
  (tests/otlp_receiver.py: the real gRPC TraceService): no caller sends a `traceparent`,
  so every request is a root span, sampled (the default parent-based always-on), as is
  vLLM's own engine span beneath it.

Load: bench/frontends.py's at 64 streams (`vllm-rs bench serve`, 1,024 requests of 128
random prompt tokens and 64 output tokens, `ignore_eos`, the client where the kernel puts
it), `RUNS` runs a start, its figures their medians; frontend CPU per token is
`harness.frontend_cpu` over the run (every process of the server but vLLM's engine: the
exporter's thread included), per token of vLLM's own count.

    /work/bin/heavy .venv/bin/python bench/traces.py [--rounds 3] [--targets ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import (
    MODEL,
    PY,
    ROOT,
    Figures,
    Results,
    Round,
    Server,
    Target,
    markdown_table,
    publish,
    run_rounds,
    rust_load,
    spread,
    switchboard,
)

sys.path.insert(0, str(ROOT))

from tests.otlp_receiver import OtlpReceiver

BEFORE = "e72fb47"  # main when issue 41's work began
CONCURRENCY, PROMPTS, OUTPUT_LEN = 64, 1024, 64
RUNS = 3
BEFORE_NAME, OFF, ON = "before", "tracing off", "tracing on"


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """The tree of `commit`, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix=f"switchboard-{commit}-") as where:
        archive = subprocess.run(
            ["git", "archive", commit], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
        yield Path(where)


def targets(names: list[str], before: Path, receiver: OtlpReceiver) -> list[Target]:
    own = switchboard(OFF)
    # -P: not the working directory (this tree) first on the path, but the checkout.
    old = Target(
        BEFORE_NAME,
        (PY, "-P", *own.argv[1:]),
        {"PYTHONPATH": str(before)},
    )
    every = {
        BEFORE_NAME: old,
        OFF: own,
        ON: switchboard(ON, "--otlp-traces-endpoint", receiver.endpoint),
    }
    return [every[name] for name in names]


def measure(receiver: OtlpReceiver) -> Callable[[Server, Round], Figures]:
    def one_start(server: Server, round_: Round) -> Figures:
        server.warm()
        rust_load(server.port, CONCURRENCY, CONCURRENCY, 10**6, pinned=False)
        runs = []
        for run in range(RUNS):
            spans = len(receiver.spans())
            with server.meter() as m:
                result = rust_load(
                    server.port, CONCURRENCY, PROMPTS, round_.seed(100 * run), pinned=False
                )
            if m.tokens != result["completed"] * OUTPUT_LEN:
                raise RuntimeError(f"{server.target.name}: {m.tokens:.0f} tokens counted")
            figures = m.figures()
            figures["output_tok_s"] = m.tokens / result["duration"]
            figures["spans_received"] = len(receiver.spans()) - spans
            print(
                f"  {server.target.name}: {figures['output_tok_s']:.0f} tok/s, "
                f"{figures['frontend_cpu_us_per_tok']:.1f} us/tok, "
                f"{figures['spans_received']} spans",
                flush=True,
            )
            runs.append(figures)
        out = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        out["runs"] = runs
        return out

    return one_start


def table(results: Results, names: list[str]) -> str:
    rows = []
    cpu = "frontend_cpu_us_per_tok"
    for name in names:
        rows.append(
            [
                name,
                spread(results.each(name, cpu), 1),
                spread(results.each(name, "output_tok_s")),
                spread(results.each(name, "spans_received")),
            ]
        )
    lines = markdown_table(
        ["target", "frontend CPU us/token", "output tok/s", "spans received a run"], rows
    )
    ratios = []
    for a, b in ((ON, OFF), (OFF, BEFORE_NAME), (ON, BEFORE_NAME)):
        if a in names and b in names:
            ratios.append(f"- {a} / {b}, round by round: {spread(results.within(a, b, cpu), 3)}")
    return "\n".join([*lines, "", *ratios])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", nargs="+", default=[BEFORE_NAME, OFF, ON])
    parser.add_argument("--no-publish", action="store_true")
    args = parser.parse_args()
    assert MODEL.is_dir(), "the tiny model: switchboard make-tiny-model .cache/tiny-model"
    receiver = OtlpReceiver()
    try:
        with checkout(BEFORE) as before:
            results = run_rounds(
                targets(args.targets, before, receiver),
                measure(receiver),
                rounds=args.rounds,
                name="traces",
            )
    finally:
        receiver.stop()
    text = table(results, args.targets)
    if args.no_publish:
        print(text)
        return
    publish("traces", {"results": results.record()}, text)


if __name__ == "__main__":
    main()
