"""The llm-d render routes on the live server: token ids as vLLM's renderer makes them
(the model's own tokenizer and chat template, loaded independently here), in vLLM's
`GenerateRequest` shape; bad bodies answered as OpenAI errors, nothing run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_chat_render_is_the_templated_prompt(live_server: LiveServer, hf_tokenizer: Any) -> None:
    body = {"model": live_server.model, "messages": MESSAGES, "max_tokens": 7, "seed": 3}
    response = httpx.post(f"{live_server.base_url}/v1/chat/completions/render", json=body)
    assert response.status_code == 200, response.text
    rendered = response.json()
    text = hf_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered["token_ids"] == hf_tokenizer.encode(text, add_special_tokens=False)
    assert rendered["model"] == live_server.model
    assert rendered["sampling_params"]["max_tokens"] == 7
    assert rendered["sampling_params"]["seed"] == 3
    assert rendered["features"] is None and rendered["request_id"]
    # The same ids reach the engine: usage counts them.
    done = httpx.post(f"{live_server.base_url}/v1/chat/completions", json=body, timeout=60).json()
    assert done["usage"]["prompt_tokens"] == len(rendered["token_ids"])


def test_completion_render_lists_one_request_per_prompt(
    live_server: LiveServer, hf_tokenizer: Any
) -> None:
    prompts = ["def main():", "import os"]
    body = {"model": live_server.model, "prompt": prompts, "n": 2}
    response = httpx.post(f"{live_server.base_url}/v1/completions/render", json=body)
    assert response.status_code == 200, response.text
    items = response.json()
    assert [i["token_ids"] for i in items] == [hf_tokenizer.encode(p) for p in prompts]
    assert all(i["sampling_params"]["n"] == 2 for i in items)
    assert live_server.running_requests() == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions/render", {"prompt": [[1, 99999]]}, "prompt"),
        (
            "/v1/chat/completions/render",
            {"messages": MESSAGES, "structured_outputs": {"regex": "(x"}},
            "structured_outputs.regex",
        ),
        ("/v1/chat/completions/render", {"messages": MESSAGES, "model": "nope"}, "model"),
    ],
)
def test_render_errors_are_openai_errors(
    live_server: LiveServer, path: str, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{live_server.base_url}{path}", json=body)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param
