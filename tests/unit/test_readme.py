"""The README keeps its promises: its Python example runs (on a tiny model here; verbatim in
the slow tier), every `specdec` command it quotes parses with the CLI's own parser, every
`make` target it names exists, and it stays short."""

import re
from pathlib import Path

import pytest

from quoted import assert_parses, specdec_commands
from tiny import hf_tiny, tiny_tokenizer

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"


def readme_api_example() -> str:
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_commands_parse(capsys):
    commands = specdec_commands(README.read_text())
    assert len(commands) >= 5, commands  # generate, serve and the results table's benches
    for argv in commands:
        assert_parses(argv, "README.md")
    capsys.readouterr()


def test_a_broken_command_is_caught():
    with pytest.raises(AssertionError, match="does not parse"):
        assert_parses(["generate", "--no-such-flag", "x"], "here")


def test_readme_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", README.read_text()))
    assert named and named <= targets, named - targets


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


def test_readme_example_runs_on_a_tiny_model(tmp_path, capsys):
    target, draft = tmp_path / "target", tmp_path / "draft"
    for path, seed in ((target, 0), (draft, 1)):
        hf_tiny("qwen2", seed=seed).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
    code = readme_api_example()
    code = code.replace('"qwen2.5-coder-1.5b-instruct"', repr(str(target)))
    code = code.replace('"qwen2.5-coder-0.5b-instruct"', repr(str(draft)))
    code = code.replace(", chat=True", "")  # the tiny tokenizer has no chat template
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and len(lines[-1].split()) == 3


@pytest.mark.slow
def test_readme_example_runs_verbatim(capsys):
    exec(compile(readme_api_example(), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()
