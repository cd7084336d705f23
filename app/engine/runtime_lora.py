"""Which LoRA adapters the control plane may load while the server runs.

Off unless asked for (`--allow-runtime-lora-updating`, or vLLM's own
VLLM_ALLOW_RUNTIME_LORA_UPDATING, as `vllm serve` reads it), as in vLLM: loading an
adapter reads the server's files, and unloading one changes what every client is
served. When on, an adapter is taken from `--lora-root` only: a `lora_path` is resolved
(symbolic links and `..` followed) and must name a directory inside the root holding an
`adapter_config.json`. Every path that fails (outside the root, missing, not a
directory, without that file, unreadable) gets the same message, so that the answers
tell nothing of which paths exist on the server. Adapters given at start-up
(`--lora-modules`) are the operator's and are not confined.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.errors import InvalidRequest, NotFound

_REFUSED = (
    "No LoRA adapter to load at this lora_path: runtime loading takes an adapter's "
    "directory under the server's LoRA root only"
)


class RuntimeLora:
    def __init__(self, root: Path | None) -> None:
        """`root`: where adapters may be loaded from; None: runtime updating is off."""
        self._root = None if root is None else os.path.realpath(root)

    def check_on(self) -> None:
        """Refuse a load or an unload while runtime updating is off."""
        if self._root is None:
            raise NotFound(
                "Loading and unloading LoRA adapters at run time is off on this server "
                "(--allow-runtime-lora-updating and --lora-root turn it on)",
                code="runtime_lora_off",
            )

    def path(self, offered: str) -> str:
        """The adapter directory `offered` names, resolved, inside the root; the one
        refusal otherwise. Blocking (it reads the file system): off the event loop."""
        self.check_on()
        assert self._root is not None
        try:
            resolved = os.path.realpath(os.path.join(self._root, offered))
            inside = os.path.commonpath([self._root, resolved]) == self._root
            found = inside and os.path.isfile(os.path.join(resolved, "adapter_config.json"))
        except (OSError, ValueError):
            found = False
        if not found:
            raise InvalidRequest(_REFUSED, param="lora_path")
        return resolved
