"""The process's peak resident memory over one method's runs: what that method needs.

Linux keeps a process's high-water RSS (`VmHWM`) and lets the process reset it
(`/proc/self/clear_refs`), so each method's peak can be read apart from the methods that
ran before it in the same process (the models they share count in every method's figure).
Elsewhere there is no reset: the figure is the process's peak so far.
"""

from __future__ import annotations

import resource
from pathlib import Path

_STATUS, _CLEAR = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak() -> None:
    """Start a new high-water mark at the current RSS (where the OS allows it)."""
    try:
        _CLEAR.write_text("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    """The highest RSS since the last `reset_peak` (or since the process started)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KB on Linux
