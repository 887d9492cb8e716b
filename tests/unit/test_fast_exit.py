"""The `specdec` command leaves with `os._exit` once its command returns (`specdec.fast_exit`),
skipping ~1 s of interpreter teardown: what the process writes at exit must still arrive,
in the order Python's own shutdown uses, and its exit status must be the command's."""

import os
import subprocess
import sys
from pathlib import Path

from tiny import hf_tiny, tiny_tokenizer

ROOT = Path(__file__).parents[2]

# A command that returns while a non-daemon thread still writes, with output left in stdout's
# buffer, the last of it by the atexit handler that runs last (registered first); before it,
# a real `generate` whose `auto` costs are stored only at exit (the CLI does not call
# LLM.generate, which would store them).
COMMAND = """
import atexit, sys, threading, time
atexit.register(print, "at exit")
from specdec import cli

real_main = cli.main

def command():
    assert real_main(sys.argv[1:]) == 0
    def late():
        time.sleep(0.3)
        print("from a thread")
    threading.Thread(target=late).start()
    print("unflushed", end=" ")
    return 3

cli.main = command
cli.run()
print("never reached")
"""


def test_the_command_exits_at_once_with_everything_written(tmp_path):
    model = tmp_path / "tiny"
    hf_tiny("qwen2").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    home = tmp_path / "home"
    env = dict(os.environ, SPECDEC_HOME=str(home), SPECDEC_COST_CACHE="1", PYTHONPATH=str(ROOT))
    env.pop("PYTHONUNBUFFERED", None)  # stdout into a pipe keeps what is not flushed
    argv = ["generate", "--model", str(model), "--draft", str(model), "--dtype", "fp32"]
    argv += ["--tune-budget", "0", "--max-tokens", "6", "--ignore-eos", "--json", "abcabc"]
    done = subprocess.run(
        [sys.executable, "-c", COMMAND, *argv], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith('{"prompt": "abcabc"')  # generate's own output
    assert lines[1:] == ["unflushed from a thread", "at exit"]  # joined, atexit, flushed
    assert len(list((home / "costs").glob("*.json"))) == 1  # LLM's atexit handler ran
