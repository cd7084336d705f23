"""GraphPipe codec throughput: decode a Request + encode an InferResponse, for one float32
tensor of 1 KB to 64 MB, in MB/s (10^6 bytes of tensor per second).

Three columns, each the median of several timed rounds:
- numpy copy: `np.copy` of the same bytes, one pass of memory: the physical limit.
- switchboard: `decode_request` (a zero-copy view of the tensor) + `encode_infer_response`
  (what the server does with a request and its answer), also reported apart.
- reference: oracle's `graphpipe` package (1.0.4), `convert.deserialize_request` +
  `convert.serialize_infer_request`. Its response encoder writes a broken `errors` vector,
  so its request encoder, which writes the same Tensor table, stands in for it. It pins
  flatbuffers 1.9, so it lives in its own venv (`--reference-python`, default
  scripts/setup makes .venv-graphpipe-ref) and this script runs itself there with `--child`.

Writes bench/results/graphpipe_codec.json and the table in docs/graphpipe.md between the
`bench:graphpipe` markers. Nothing asserts timings; run it on an otherwise idle machine.

    .venv/bin/python bench/graphpipe_codec.py [--rounds 5] [--reference-python PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "graphpipe_codec.json"
REFERENCE_PYTHON = ROOT / ".venv-graphpipe-ref" / "bin" / "python"
SIZES = [2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26]  # 1 KB .. 64 MB
MIN_ROUND_S = 0.25


def throughput(op: Callable[[], object], nbytes: int, rounds: int) -> float:
    """Median MB/s of `op` over `rounds` rounds of at least MIN_ROUND_S each."""
    op()  # warm: first-touch allocations, imports, caches
    started = time.perf_counter()
    op()
    once = max(time.perf_counter() - started, 1e-7)
    iterations = max(1, int(MIN_ROUND_S / once))
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(iterations):
            op()
        rates.append(nbytes * iterations / (time.perf_counter() - started) / 1e6)
    return statistics.median(rates)


def tensor(nbytes: int) -> np.ndarray:
    return np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)


def measure_numpy_and_switchboard(rounds: int) -> list[dict[str, float]]:
    from app.protocols.graphpipe.decode import InferCall, decode_request
    from app.protocols.graphpipe.encode import encode_infer_request, encode_infer_response

    limit = 2**31
    rows = []
    for nbytes in SIZES:
        array = tensor(nbytes)
        request = encode_infer_request([array], ["x"])
        call = decode_request(request, max_bytes=limit)
        assert isinstance(call, InferCall) and np.array_equal(call.inputs[0], array)

        def decode(request: memoryview = request) -> np.ndarray:
            call = decode_request(request, max_bytes=limit)
            assert isinstance(call, InferCall)
            return call.inputs[0]

        rows.append(
            {
                "bytes": nbytes,
                "numpy_copy": throughput(lambda a=array: np.copy(a), nbytes, rounds),
                "switchboard": throughput(
                    lambda: encode_infer_response([decode()]), nbytes, rounds
                ),
                "switchboard_decode": throughput(decode, nbytes, rounds),
                "switchboard_encode": throughput(
                    lambda a=array: encode_infer_response([a]), nbytes, rounds
                ),
            }
        )
        print(f"{nbytes:>10} B  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def measure_reference(rounds: int) -> dict[str, Any]:
    """Runs in the reference venv: only numpy and oracle's graphpipe are importable."""
    from importlib.metadata import version

    from graphpipe import convert

    rows = []
    for nbytes in SIZES:
        array = tensor(nbytes)

        def encode(a: np.ndarray = array) -> bytes:
            return bytes(convert.serialize_infer_request(convert.InferReq(None, [a], ["x"])))

        request = encode()

        def decode(request: bytes = request) -> np.ndarray:
            return convert.deserialize_request(request).input_tensors[0]

        assert np.array_equal(decode(), array)
        rows.append(
            {
                "bytes": nbytes,
                "reference": throughput(lambda: encode(decode()), nbytes, rounds),
                "reference_decode": throughput(decode, nbytes, rounds),
                "reference_encode": throughput(encode, nbytes, rounds),
            }
        )
        print(f"{nbytes:>10} B  {rows[-1]}", file=sys.stderr, flush=True)
    return {
        "package": f"graphpipe {version('graphpipe')}",
        "flatbuffers": version("flatbuffers"),
        "numpy": np.__version__,
        "rows": rows,
    }


def _size(nbytes: int) -> str:
    return f"{nbytes // 2**20} MB" if nbytes >= 2**20 else f"{nbytes // 2**10} KB"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| tensor | numpy copy | switchboard decode+encode | vs numpy | reference "
        "decode+encode | switchboard / reference |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ours, ref = row["switchboard"], row.get("reference")
        ref_cell = f"{ref:,.0f}" if ref else "n/a"
        ratio_cell = f"{ours / ref:.1f}x" if ref else "n/a"
        lines.append(
            f"| {_size(row['bytes'])} | {row['numpy_copy']:,.0f} | {ours:,.0f} "
            f"| {ours / row['numpy_copy']:.2f}x | {ref_cell} | {ratio_cell} |"
        )
    return "\n".join(lines)


def write_doc(rows: list[dict[str, Any]], info: dict[str, Any], reference: str) -> None:
    from harness import write_table

    write_table(
        "graphpipe",
        f"MB/s of tensor bytes (10^6 B/s), medians; {info['cpu']}, "
        f"{info['cores']} cores, Python {info['python']}, numpy {info['numpy']}; "
        f"reference: {reference}.\n\n{table(rows)}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference-python", type=Path, default=REFERENCE_PYTHON)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_reference(args.rounds)))
        return
    # Not at the top: the child runs in the reference venv, which has none of its imports.
    from harness import machine

    info = {**machine(), "numpy": np.__version__}
    rows: list[dict[str, Any]] = measure_numpy_and_switchboard(args.rounds)
    reference: dict[str, Any] = {"package": "not measured (no reference venv)", "rows": []}
    if args.reference_python.exists():
        done = subprocess.run(
            [str(args.reference_python), __file__, "--child", "--rounds", str(args.rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
        reference = json.loads(done.stdout)
    by_size = {r["bytes"]: r for r in reference["rows"]}
    for row in rows:
        row.update({k: v for k, v in by_size.get(row["bytes"], {}).items() if k != "bytes"})
    label = " ".join(
        filter(None, [reference["package"], f"flatbuffers {reference.get('flatbuffers', '')}"])
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "unit": "MB/s of tensor bytes (10^6 B/s), median over rounds",
                "rounds": args.rounds,
                "machine": info,
                "reference": {k: v for k, v in reference.items() if k != "rows"},
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    write_doc(rows, info, label)
    print(table(rows))


if __name__ == "__main__":
    main()
