"""The CPU host's KV cache and compile cache defaults (no engine needed)."""

from __future__ import annotations

import pytest

from app.engine.cpu_host import DEFAULT_KV_CACHE_BYTES, GiB, kv_cache_default, without_aot_compile


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


def test_vllm_reads_the_compile_cache_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable set is the one vLLM reads, and it turns the AOT artifacts off (vLLM's
    own default on this torch is on)."""
    import vllm.envs as envs

    # Set, then removed: monkeypatch then restores the variable as it was after the test,
    # whatever `without_aot_compile` wrote.
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    envs.disable_envs_cache()
    assert envs.VLLM_USE_AOT_COMPILE is True
    without_aot_compile()
    assert envs.VLLM_USE_AOT_COMPILE is False


def test_a_chosen_compile_cache_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    envs.disable_envs_cache()
    without_aot_compile()
    assert envs.VLLM_USE_AOT_COMPILE is True
