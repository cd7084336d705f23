"""vLLM's own engine flags, parsed by vLLM's parser so they keep the names `vllm serve`
gives them (`--max-model-len`, `--dtype`, `--tensor-parallel-size`, ...). Imports vLLM,
so only the `serve` command loads it."""

from __future__ import annotations

from typing import Any


def parse_engine_args(argv: list[str]) -> dict[str, Any]:
    """The engine flags in `argv` as AsyncEngineArgs fields, only those the user set.
    Unknown flags exit with argparse's usage message, as `vllm serve` does."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="switchboard serve (vLLM engine flags)")
    AsyncEngineArgs.add_cli_args(parser)
    defaults = vars(parser.parse_args([]))
    given = vars(parser.parse_args(argv))
    return {key: value for key, value in given.items() if value != defaults.get(key)}
