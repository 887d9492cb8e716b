"""Commands quoted in the README and the docs, and whether the CLI still parses them."""

import re
import shlex

from specdec.cli import build_parser


def specdec_commands(text: str) -> list[list[str]]:
    """The argv (after `specdec`) of every command quoted in `text`: lines of fenced shell
    blocks (continuations joined, comments dropped) and inline code spans that run `specdec`,
    `.venv/bin/specdec` or `-m specdec.cli` with flags. A `...` stands for arguments left
    out."""
    lines = []
    for lang, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if lang in ("bash", "sh", "console", ""):
            lines += block.replace("\\\n", " ").splitlines()
    # an inline span is a command when it has flags (`specdec generate` alone names one)
    spans = re.findall(r"(?<!`)`((?:\.venv/bin/)?specdec [^`]+)`", text)
    lines += [span for span in spans if " -" in span]
    commands = []
    for line in lines:
        line = line.split(" #")[0].strip()
        match = re.search(r"(?:^|\s|/)(?:specdec|-m specdec\.cli)\s+(.*)$", line)
        if not match or line.startswith(("#", "python", "from ", "import ")):
            continue
        argv = [a for a in shlex.split(match.group(1)) if a != "..."]
        if argv and not argv[0].startswith("-") or argv == ["--help"]:
            commands.append(argv)
    return commands


def assert_parses(argv: list[str], where: str) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 0, f"{where}: `specdec {' '.join(argv)}` does not parse"
