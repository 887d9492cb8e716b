"""The README's Python API example runs (on a tiny model here; verbatim in the slow tier)."""

import re
from pathlib import Path

import pytest

from tiny import hf_tiny, tiny_tokenizer

README = Path(__file__).parents[2] / "README.md"


def readme_api_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs_on_a_tiny_model(tmp_path, capsys):
    target, draft = tmp_path / "target", tmp_path / "draft"
    for path, seed in ((target, 0), (draft, 1)):
        hf_tiny("qwen2", seed=seed).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
    tiny_tokenizer().save_pretrained(target)
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
