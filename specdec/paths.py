"""Where specdec keeps what it builds and measures: `$SPECDEC_HOME`, else ~/.cache/specdec."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Assembled GGUFs, converted models, kernel plans, native builds and `auto`'s costs."""
    home = os.environ.get("SPECDEC_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "specdec"
