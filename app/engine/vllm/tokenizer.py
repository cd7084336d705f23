"""The engine's own tokenizer, and vLLM's chat renderer, behind the neutral `Tokenizer`.

`apply_chat_template` templates a neutral `ChatPrompt` the way `vllm serve` renders the same
conversation sent to its chat endpoint: the messages become the OpenAI-chat shape vLLM's
renderer takes (text parts, images as vLLM's in-memory image parts, assistant calls with
JSON-text arguments, tool answers), and vLLM's own `render_messages` parses them (content
format detection, "developer" folded into "system" for templates that lack it, call
arguments given to the template as objects) and applies the template with the request's
kwargs merged over the server's (`tools`), filtered to what the template reads. The text
is tokenized without special tokens, as vLLM tokenizes a rendered chat (the template
writes its own). A template that refuses the conversation is vLLM's
`VLLMValidationError`, the client's 400, through `map_engine_errors`.

A text that cannot fit the context is refused before it is tokenized (`encode`, which
every prompt passes through, a rendered chat's text included): no token covers more than
the longest entry of the vocabulary (in UTF-8 bytes, which a token's text never
undercounts: byte-level and SentencePiece alphabets spell each byte with at least one),
so a text of more characters than the context times that length holds more tokens than
the context. Tokenizing costs time in proportion to the text (16 MiB took 15 s), and one
thread builds every prompt: a text that could never run must not hold it. Templating
such a text costs the interpreter's lock tens of milliseconds before that refusal: a
prompt of more than `IN_PROCESS_CHARS` of text is templated (and refused) in the render
process (`app.engine.vllm.render_process`) by this same class over the same renderer.

Images: vLLM's parser records each image part and leaves the model's placeholder in the
text, so each image comes out as its block with one pad token (`VisionInfo`); vLLM's own
multimodal data is dropped here, since the request carries the decoded image itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from vllm.renderers.params import ChatParams, merge_kwargs

from app.engine.base import ChatMessage, ChatPrompt, ImagePart, TextPart
from app.engine.vllm.errors import map_engine_errors
from app.engine.vllm.render_process import IN_PROCESS_CHARS, RenderProcess, text_chars
from app.errors import ContextLengthExceeded, InvalidRequest


def _content(message: ChatMessage) -> str | list[dict[str, Any]] | None:
    """A message's parts as a chat client sends them: one text part as a string (vLLM
    renders a string and a one-part list alike), several parts as a list."""
    if not message.parts:
        return None
    if len(message.parts) == 1 and isinstance(message.parts[0], TextPart):
        return message.parts[0].text
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            content.append({"type": "image_pil", "image_pil": part.image.pixels})
        else:
            content.append({"type": "text", "text": part.text})
    return content


def _message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": _content(message)}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.reasoning is not None:
        out["reasoning"] = message.reasoning
    return out


class HfTokenizer:
    """The engine's own tokenizer and chat renderer, behind the neutral `Tokenizer`."""

    def __init__(
        self,
        tokenizer: Any,
        renderer: Any,
        max_model_len: int,
        render_process: RenderProcess | None = None,
    ) -> None:
        self._tok = tokenizer
        self._renderer = renderer
        # Where a prompt over `IN_PROCESS_CHARS` of text is templated; None: here.
        self._render_process = render_process
        self.token_to_str = lru_cache(maxsize=1 << 16)(self._token_to_str)
        self._max_model_len = max_model_len
        self._longest_token = max((len(t.encode()) for t in tokenizer.get_vocab()), default=1)

    def close(self) -> None:
        if self._render_process is not None:
            self._render_process.close()

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self._tok, "eos_token_id", None)
        return None if eos is None else int(eos)

    @property
    def has_chat_template(self) -> bool:
        return getattr(self._tok, "chat_template", None) is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`text`'s token ids; `ContextLengthExceeded` without tokenizing it when it
        holds more tokens than the context (see the module docstring)."""
        if len(text) > self._max_model_len * self._longest_token:
            least = -(-len(text) // self._longest_token)
            raise ContextLengthExceeded(
                f"This model's maximum context length is {self._max_model_len} tokens. "
                f"However, the prompt of {len(text)} characters holds at least {least} "
                f"tokens (none of this model's tokens spells more than "
                f"{self._longest_token} bytes). Please reduce the length of the prompt.",
                code="context_length_exceeded",
            )
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, prompt: ChatPrompt) -> list[int]:
        if not self.has_chat_template:
            raise InvalidRequest("This model has no chat template", param="messages")
        if self._render_process is not None and text_chars(prompt) > IN_PROCESS_CHARS:
            ids = self._render_process.render(prompt)
            if ids is not None:
                return ids
        # As vLLM's chat serving merges them: the server's defaults (tools, text out),
        # then the client's kwargs, then the request's own switches.
        kwargs = merge_kwargs(
            {"tools": [dict(t) for t in prompt.tools] if prompt.tools else None, "tokenize": False},
            merge_kwargs(
                dict(prompt.template_kwargs),
                {
                    "add_generation_prompt": prompt.add_generation_prompt,
                    "continue_final_message": prompt.continue_final_message,
                },
            ),
        )
        params = ChatParams(chat_template_content_format="auto", chat_template_kwargs=kwargs)
        with map_engine_errors():
            _, rendered = self._renderer.render_messages(
                [_message(m) for m in prompt.messages], params
            )
        if "prompt_token_ids" in rendered:  # a tokenizer that renders straight to ids
            return [int(t) for t in rendered["prompt_token_ids"]]
        return self.encode(str(rendered["prompt"]), add_special_tokens=False)

    def _token_to_str(self, token_id: int) -> str:
        return str(self._tok.decode([token_id], skip_special_tokens=False))
