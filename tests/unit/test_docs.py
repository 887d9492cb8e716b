"""The documentation site: it builds without a warning (mkdocs --strict), its generated CLI
reference is what the parsers say today, the commands and code it quotes still work, and the
docs/ tree stays small and free of run labels."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quoted import assert_parses, specdec_commands

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "reference" / "cli.md"}


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p not in GENERATED)


def _load_generator():
    path = ROOT / "scripts" / "gen_cli_reference.py"
    spec = importlib.util.spec_from_file_location("gen_cli_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "design" / "contracts" / "index.html").exists()
    # The site works offline: no page loads anything from elsewhere (a `.mermaid` element
    # makes Material fetch mermaid.js from a CDN; its default font comes from Google Fonts).
    fetching = re.compile(r'<(?:script|link)[^>]*(?:src|href)="https?://|class="mermaid"')
    online = [p for p in (tmp_path / "site").rglob("*.html") if fetching.search(p.read_text())]
    assert not online, f"pages that fetch from the network when viewed: {online}"
    assert (tmp_path / "site" / "img" / "architecture-step.svg").exists()


def test_the_diagrams_are_drawn_from_their_sources(script):
    """Every docs/diagrams/*.mmd has its SVG, drawn from that very text (its sha256 is in the
    SVG); a page embeds the SVG, never a mermaid fence."""
    render = script("render_diagrams")
    sources = sorted(render.SOURCES.glob("*.mmd"))
    assert sources
    assert not render.stale(), "run python scripts/render_diagrams.py (needs chromium, npm)"
    for source in sources:
        assert any(f"img/{source.stem}.svg" in page.read_text() for page in _pages()), source
    fenced = [p for p in _pages() if "```mermaid" in p.read_text()]
    assert not fenced, f"mermaid fences (drawn from a CDN at view time) in {fenced}"


def test_the_cli_reference_is_current():
    generator = _load_generator()
    assert generator.OUT.read_text() == generator.render(), (
        "docs/reference/cli.md is out of date: run python scripts/gen_cli_reference.py"
    )


def test_the_cli_reference_covers_every_subcommand():
    text = (DOCS / "reference" / "cli.md").read_text()
    for name in ("generate", "serve", "bench", "bench-serve", "train-speculator", "doctor"):
        assert f"## specdec {name}\n" in text


def test_every_command_in_the_docs_parses(capsys):
    checked = 0
    for page in _pages():
        for argv in specdec_commands(page.read_text()):
            assert_parses(argv, str(page.relative_to(ROOT)))
            checked += 1
    capsys.readouterr()
    assert checked >= 20


def test_the_custom_acceptor_howto_runs(capsys):
    """The worked example is code a reader copies: it must satisfy the protocol and print
    the verdict its comment promises."""
    text = (DOCS / "howto" / "custom-acceptor.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "custom-acceptor.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "[2] [[1, 0, 2]]"


@pytest.mark.parametrize(
    "page", ["architecture", "glossary", "contracts", "auto", "kernels", "losslessness"]
)
def test_the_design_pages_the_code_cites_exist(page):
    assert (DOCS / "design" / f"{page}.md").is_file()


def test_docs_stay_small():
    total = sum(p.stat().st_size for p in DOCS.rglob("*") if p.is_file())
    assert total <= 3 * 1024 * 1024, f"docs/ holds {total / 1e6:.1f} MB"


def test_no_run_labels():
    """A figure cites its docs section or results file, never a session's label."""
    label = re.compile(r"\b" + "stop" + r"s? [0-9]+", re.I)
    places = [ROOT / "README.md", *DOCS.rglob("*"), *(ROOT / "scripts").rglob("*.py")]
    places += [*(ROOT / "tests").rglob("*.py"), *(ROOT / "examples").rglob("*")]
    places += [*(ROOT / "specdec").rglob("*.py"), *(ROOT / "specdec").rglob("*.h")]
    found = []
    for path in places:
        if path.is_file() and path.suffix in (".md", ".py", ".csv", ".json", ".log", ".sh", ".h"):
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if label.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not found, "\n".join(found)
