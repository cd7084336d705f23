"""The engine's own tokenizer behind the neutral `Tokenizer` protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from app.errors import InvalidRequest


class HfTokenizer:
    """The engine's own tokenizer, behind the neutral `Tokenizer` protocol."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.token_to_str = lru_cache(maxsize=1 << 16)(self._token_to_str)

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self._tok, "eos_token_id", None)
        return None if eos is None else int(eos)

    @property
    def has_chat_template(self) -> bool:
        return getattr(self._tok, "chat_template", None) is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
    ) -> list[int]:
        if not self.has_chat_template:
            raise InvalidRequest("This model has no chat template", param="messages")
        try:
            text = self._tok.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
            )
        except Exception as exc:  # a jinja template error is the client's input
            raise InvalidRequest(f"Could not apply the chat template: {exc}") from exc
        # The template writes its own special tokens; adding BOS again would double it.
        return self.encode(str(text), add_special_tokens=False)

    def _token_to_str(self, token_id: int) -> str:
        return str(self._tok.decode([token_id], skip_special_tokens=False))
