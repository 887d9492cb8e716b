"""Ending the `specdec` command's process without the interpreter's teardown.

After a command has returned, a process that loaded a model still spent ~1 s of CPU in
Python's finalization: cyclic collections over the models' object graph, freeing its objects
one by one, torch unregistering its operators (docs/benchmarks.md, Zen 3). The kernel
releases the same memory at exit in about a tenth of that. What the process must write is
written first, in the order Python's own shutdown uses, then it leaves with `os._exit`.
Only the console command does this; a library user's process ends as Python ends it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """Join non-daemon threads, run atexit handlers (auto's stored costs, weakref finalizers,
    logging's flush), flush stdout and stderr, then end the process with `code`."""
    # Py_Finalize's own first two steps (private names): _shutdown runs the executors' exit
    # hooks, waking idle workers that a plain join of non-daemon threads would wait on forever.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (`| head`) or a closed stream
            code = code or 120  # Python's status when its final flush fails
    os._exit(code)
