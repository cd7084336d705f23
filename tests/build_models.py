"""Builds every model the suite's lanes share under .cache/ (`scripts/test` runs it before
starting them): two pytest processes building one model at once would write the same
files together. Each is built once, on first use, as the fixtures would."""

from __future__ import annotations

from tests.conftest import concepts_path, tiny_lora_path, tiny_model_path, tiny_vl_model_path
from tests.fleet_setup import CONTEXT


def main() -> None:
    tiny_model_path()
    tiny_model_path(CONTEXT)
    tiny_lora_path()
    tiny_vl_model_path()
    concepts_path()


if __name__ == "__main__":
    main()
