"""`python -m specdec`: the `specdec` command."""

from specdec.cli import run

run()
