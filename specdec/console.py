"""Status lines for a person at a terminal, on stderr."""

from __future__ import annotations

import sys

from tqdm import tqdm


def status(message: str) -> None:
    """One status line on stderr; tqdm.write keeps it from tearing an active progress bar."""
    tqdm.write(f"specdec: {message}", file=sys.stderr)
