"""The playground's files: served at / with a same-origin-only policy, shipped as package
data (a non-editable install must serve them too), and asking nothing of other hosts."""

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from fastapi.testclient import TestClient

from specdec.serving.app import STATIC, build_app

from scripted import scripted_engine

ROOT = Path(__file__).parents[2]


def test_the_page_and_its_files_are_served():
    engine, _ = scripted_engine(drafter=False)
    client = TestClient(build_app(engine, "tiny", api_key="k"))
    page = client.get("/")  # public: the page holds no data, the API it calls wants the key
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
        assert client.get(src).status_code == 200, src
    assert client.get("/v1/models").status_code == 401


def test_nothing_is_fetched_from_elsewhere():
    for path in STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), path
        assert not re.search(r"""(fetch|import)\(\s*["'`]https?:""", text), path
        assert "@import" not in text and "url(http" not in text, path


def test_every_static_file_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["specdec.serving"]
    for path in STATIC.iterdir():
        assert any(fnmatch(f"static/{path.name}", g) for g in globs), path.name
