"""The CPU at hand, as /proc/cpuinfo names it: what kernel builds and plans are keyed by."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_info() -> tuple[str, str]:
    """The CPU's model name and its feature flags, as /proc/cpuinfo gives them."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), "x86_64"):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = value.strip()
    except OSError:
        pass
    return model, flags
