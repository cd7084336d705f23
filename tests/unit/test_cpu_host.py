"""The CPU host's KV cache default (no engine needed)."""

from __future__ import annotations

import pytest

from app.engine.cpu_host import DEFAULT_KV_CACHE_BYTES, GiB, kv_cache_default


def test_a_given_size_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_default({"kv_cache_memory_bytes": GiB}, 100 * GiB) is None


def test_vllms_own_variable_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert kv_cache_default({}, 100 * GiB) is None


def test_the_default_is_bounded_by_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_default({}, 100 * GiB) == DEFAULT_KV_CACHE_BYTES
    assert kv_cache_default({}, 8 * GiB) == 2 * GiB
    assert kv_cache_default({}, 0) == GiB // 4
