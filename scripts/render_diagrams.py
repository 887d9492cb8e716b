"""Render the documentation's diagrams (docs/diagrams/*.mmd) to SVG files the pages embed.

The site then needs no JavaScript to show them and works offline: mkdocs-material would
otherwise fetch mermaid.js from a CDN at view time (3.6 MB, and nothing without a network).
Mermaid lays text out in a browser, so this runs a pinned mermaid build (`npm pack`) in
headless Chromium (Debian's `chromium`) once per changed diagram; `make docs` only copies
the SVGs. Each SVG records the sha256 of its source, which tests/unit/test_docs.py checks,
so an edited diagram whose picture was not redrawn fails the test run.

    python scripts/render_diagrams.py              # every diagram whose source changed
    python scripts/render_diagrams.py --all --mermaid node_modules/mermaid/dist/mermaid.min.js
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = ROOT / "docs" / "diagrams"
MERMAID = "mermaid@11.17.2"  # the version the SVGs were drawn with
STAMP = re.compile(r"<!-- source sha256: ([0-9a-f]{64}) -->")
CONFIG = {
    "startOnLoad": False,
    "theme": "neutral",
    "securityLevel": "strict",
    "flowchart": {"htmlLabels": False, "wrappingWidth": 480},  # SVG text, as in an <img>
    "fontFamily": "Roboto, Helvetica, Arial, sans-serif",
}
PAGE = """<!doctype html><html><body><pre id="out">pending</pre>
<script src="{script}"></script>
<script>
mermaid.initialize({config});
mermaid.render("diagram", {source}).then(
  (r) => {{ document.getElementById("out").textContent =
            "OK" + btoa(unescape(encodeURIComponent(r.svg))); }},
  (e) => {{ document.getElementById("out").textContent = "ERR" + e; }});
</script></body></html>
"""


def svg_path(source: Path) -> Path:
    return ROOT / "docs" / "img" / f"{source.stem}.svg"


def digest(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def recorded_digest(svg: Path) -> str | None:
    """The sha256 of the source an SVG was drawn from (None: not drawn by this script)."""
    if not svg.is_file():
        return None
    found = STAMP.search(svg.read_text()[:400])
    return found.group(1) if found else None


def stale() -> list[Path]:
    """The diagram sources whose SVG is missing or was drawn from other text."""
    return [s for s in sorted(SOURCES.glob("*.mmd")) if recorded_digest(svg_path(s)) != digest(s)]


def fetch_mermaid(into: Path) -> Path:
    """The pinned mermaid.min.js, through npm's own client."""
    subprocess.run(["npm", "pack", MERMAID, "--silent"], cwd=into, check=True,
                   capture_output=True)  # fmt: skip
    [tgz] = into.glob("mermaid-*.tgz")
    with tarfile.open(tgz) as tar:
        member = tar.getmember("package/dist/mermaid.min.js")
        member.name = "mermaid.min.js"
        tar.extract(member, into, filter="data")
    return into / "mermaid.min.js"


def render(source: Path, script: Path, chromium: str, work: Path) -> str:
    page = work / f"{source.stem}.html"
    page.write_text(PAGE.format(script=script.resolve().as_uri(), config=json.dumps(CONFIG),
                                source=json.dumps(source.read_text())))  # fmt: skip
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
         "--virtual-time-budget=20000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    found = re.search(r'<pre id="out">(OK|ERR)([^<]*)</pre>', dom)
    if found is None or found.group(1) != "OK":
        raise SystemExit(f"{source.name}: mermaid did not render: {found and found.group(2)}")
    svg = base64.b64decode(found.group(2)).decode()
    return f"<!-- source sha256: {digest(source)} -->\n{svg}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="redraw every diagram")
    parser.add_argument("--mermaid", type=Path, help="a mermaid.min.js (default: npm pack)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    todo = sorted(SOURCES.glob("*.mmd")) if args.all else stale()
    if not todo:
        print("every diagram is current")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = args.mermaid or fetch_mermaid(work)
        for source in todo:
            svg_path(source).write_text(render(source, script, args.chromium, work))
            print(f"wrote {svg_path(source).relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
