"""What every benchmark shares: the machine it ran on, and writing its table into a
document between `<!-- bench:NAME -->` markers."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


def write_table(name: str, table: str, document: Path = ROOT / "README.md") -> None:
    """Replace what stands between the `bench:NAME` markers of `document` with `table`."""
    pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(\n<!-- /bench:{name} -->)", re.S)
    text = document.read_text()
    if not pattern.search(text):
        raise ValueError(f"{document} has no bench:{name} markers")
    document.write_text(pattern.sub(lambda m: m.group(1) + table + m.group(2), text))
