"""The render process's own end (`app.engine.vllm.render_process` starts it): the engine's
renderer built by vLLM from the engine's configuration, behind the serving process's own
`HfTokenizer`, then one prompt a frame, until its stdin ends. Its answer is what the
serving process would have made: the token ids, or the `SwitchboardError` raised (too
long for the context, a template's refusal); anything else is a bug of ours, told as
"failed" for the server to withhold."""

from __future__ import annotations

import pickle
import sys
from typing import IO, Any

from app.engine.vllm.render_process import received, send
from app.errors import SwitchboardError
from app.heap import trim
from app.pipe_child import child_outbox


def _serve(inbox: IO[bytes], outbox: IO[bytes]) -> None:
    """The child: the engine's renderer built from its configuration, then one prompt a
    frame until its stdin ends."""
    config, max_model_len = received(inbox)
    try:
        from vllm.renderers.registry import renderer_from_config

        from app.engine.vllm.tokenizer import HfTokenizer

        renderer = renderer_from_config(pickle.loads(config))
        tokenizer = HfTokenizer(renderer.get_tokenizer(), renderer, max_model_len)
    except Exception as exc:  # told to the server, which templates in place
        send(outbox, ("failed", repr(exc)))
        return
    send(outbox, ("ready", None))
    while True:
        try:
            prompt = received(inbox)
        except EOFError:
            return
        try:
            answer: tuple[str, Any] = ("ok", tokenizer.apply_chat_template(prompt))
        except SwitchboardError as exc:
            answer = ("error", exc)
        except Exception as exc:  # a bug of ours: the server withholds it
            answer = ("failed", repr(exc))
        send(outbox, answer)
        del prompt, answer
        trim()  # every prompt here is a big one: what templating it held, given back


def main() -> None:
    outbox = child_outbox(int(sys.argv[2]), int(sys.argv[1]), "the render process")
    _serve(sys.stdin.buffer, outbox)


if __name__ == "__main__":
    main()
