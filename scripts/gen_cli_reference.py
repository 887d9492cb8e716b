"""Write docs/reference/cli.md from the CLI's own argument parsers.

The reference is generated, never edited by hand: every `specdec` subcommand's `--help`,
as `specdec.cli.build_parser()` formats it at a fixed width, so the page cannot drift from
the flags. tests/unit/test_docs.py fails when the committed file is not what this writes.

    python scripts/gen_cli_reference.py            # rewrite docs/reference/cli.md
    python scripts/gen_cli_reference.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
WIDTH = "100"  # argparse reads $COLUMNS for its line width: fixed, so the page is stable

HEADER = """# CLI reference

Generated from the argument parsers by `scripts/gen_cli_reference.py` (do not edit by
hand; `make docs` regenerates it). Every command also answers `--help`.
"""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of each subcommand, depth first, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((name, sub))
                found.extend(_subcommands(sub))
    return found


def render() -> str:
    """The whole page as markdown."""
    from specdec.cli import build_parser

    parser = build_parser()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [HEADER, "## specdec\n", "```text\n" + parser.format_help() + "```\n"]
        for _, sub in _subcommands(parser):
            parts.append(f"## {sub.prog}\n")
            parts.append("```text\n" + sub.format_help() + "```\n")
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def main() -> int:
    check = "--check" in sys.argv[1:]
    text = render()
    if check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/gen_cli_reference.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
