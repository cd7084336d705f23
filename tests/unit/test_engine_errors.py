"""The error boundary around vLLM: `map_engine_errors` maps vLLM's exception types (built
here, no engine needed) and nothing else; the concept file and the engine arguments are
start-up `ConfigError`s, never client errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from app.errors import (
    EngineDead,
    EngineError,
    InvalidRequest,
    NotFound,
    Overloaded,
    SwitchboardError,
)

errors = pytest.importorskip("app.engine.vllm.errors")
from vllm.exceptions import (  # noqa: E402
    GenerationError,
    LoRAAdapterNotFoundError,
    MaxQueuedTokensError,
    QueueOverflowError,
    VLLMClientError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError  # noqa: E402

from app.engine.concepts import load_concepts  # noqa: E402
from app.engine.vllm import startup  # noqa: E402
from app.errors import ConfigError  # noqa: E402


def _mapped(exc: BaseException) -> BaseException:
    with pytest.raises(BaseException) as raised, errors.map_engine_errors():
        raise exc
    return raised.value


@pytest.mark.parametrize(
    ("exc", "mapped", "message"),
    [
        (EngineDeadError(), EngineDead, "The engine is not running"),
        (LoRAAdapterNotFoundError("a", "/p"), NotFound, "Loading lora a failed"),
        (VLLMNotFoundError("no such thing"), NotFound, "no such thing"),
        (
            VLLMValidationError("top_k is wrong", parameter="top_k", value="x" * 10_000),
            InvalidRequest,
            "top_k is wrong",
        ),
        (VLLMUnprocessableEntityError("cannot fetch", parameter="image"), InvalidRequest, "cannot"),
        (VLLMClientError("bad"), InvalidRequest, "bad"),
        (QueueOverflowError(), Overloaded, "The engine is currently busy"),
        (MaxQueuedTokensError(), Overloaded, "The engine has reached its prefill"),
        (EngineGenerateError(), EngineError, "The engine failed the request (error id "),
        (GenerationError("secret inside"), EngineError, "The engine failed the request"),
    ],
)
def test_vllm_exceptions_are_mapped_by_type(
    exc: BaseException, mapped: type[SwitchboardError], message: str
) -> None:
    error = _mapped(exc)
    assert type(error) is mapped
    assert isinstance(error, SwitchboardError) and error.message.startswith(message)
    assert error.__cause__ is exc
    assert "secret" not in error.message
    if isinstance(exc, VLLMValidationError):
        # The parameter is kept; the rejected value (anything a client sent) is not echoed.
        assert error.param == "top_k" and error.message == "top_k is wrong"


@pytest.mark.parametrize(
    "exc", [ValueError("ours"), TypeError("ours"), KeyError("ours"), RuntimeError("ours")]
)
def test_anything_else_is_not_a_client_error(exc: BaseException) -> None:
    """A built-in exception is a bug (ours or vLLM's): it passes through untouched, and the
    transport answers it as an InternalError, never as a 400."""
    assert _mapped(exc) is exc


def test_a_context_length_message_is_not_matched_by_its_words() -> None:
    error = _mapped(VLLMValidationError("longer than the maximum context length (max_model_len)"))
    assert type(error) is InvalidRequest  # our own check_prompt runs first; no guessing here


def _concepts(path: Path, **tensors: np.ndarray) -> Path:
    save_file(tensors, str(path), metadata={"concepts": '["a", "b"]'})
    return path


def test_a_bad_concept_file_is_a_config_error(tmp_path: Path) -> None:
    good = np.zeros((1, 2, 8), dtype=np.float32)
    layers = np.array([0], dtype=np.int64)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    cases = {
        tmp_path / "missing.safetensors": "cannot read the concept file",
        garbage: "cannot read the concept file",
        _concepts(tmp_path / "no-layers.safetensors", directions=good): "has no 'layers'",
        _concepts(
            tmp_path / "shape.safetensors", directions=good[:, :1], layers=layers
        ): "do not match",
    }
    for path, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_concepts(path)
    concepts = load_concepts(_concepts(tmp_path / "ok.safetensors", directions=good, layers=layers))
    concepts.check_model(hidden_size=8, num_layers=1)
    with pytest.raises(ConfigError, match="hidden size is 16"):
        concepts.check_model(hidden_size=16, num_layers=1)
    with pytest.raises(ConfigError, match=r"layers \[0\] do not exist"):
        concepts.check_model(hidden_size=8, num_layers=0)


def test_engine_arguments_that_do_not_work_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the engine arguments do not work"):
        startup._engine_config({"model": str(tmp_path), "no_such_argument": 1})
