"""`specdec bench-serve --url`: the base URL the `openai` client takes (with /v1) works as
well as the bare root, and a URL that is not an OpenAI server gets one clear error line
instead of a traceback."""

import http.server
import json
import threading

import pytest

from specdec.cli import main

from tiny_server import MODEL, free_port


def bench(url: str, tmp_path, *extra: str) -> int:
    out = tmp_path / "serve.json"
    argv = ["bench-serve", "--url", url, "--dataset", "code", "--num-prompts", "2"]
    return main([*argv, "--max-tokens", "4", "--concurrency", "1", "--out", str(out), *extra])


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_url_with_or_without_v1(server, tmp_path, capsys, suffix):
    assert bench(server.url + suffix, tmp_path) == 0
    rows = json.loads((tmp_path / "serve.json").read_text())
    assert [(r["server"], r["failed"], r["output_tokens"]) for r in rows] == [("given", 0, 8)]


def test_provenance_off_and_on_are_measured_back_to_back(server, tmp_path):
    assert bench(server.url + "/v1", tmp_path, "--provenance", "off,on") == 0
    rows = json.loads((tmp_path / "serve.json").read_text())
    assert [r["server"] for r in rows] == ["given, provenance off", "given, provenance on"]
    assert all(r["failed"] == 0 and r["output_tokens"] == 8 for r in rows)


class _NotOpenAI(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = b"<html>hello</html>" if self.path != "/v1/models" else b'{"models": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def not_openai():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _NotOpenAI)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specdec: error: "), err
    return err[0]


def test_a_server_that_is_not_openai_gets_one_line(not_openai, tmp_path, capsys):
    assert bench(not_openai + "/v1", tmp_path) == 2
    assert "did not answer like an OpenAI server" in one_error_line(capsys)


def test_a_wrong_path_gets_one_line(server, tmp_path, capsys):
    assert bench(server.url + "/health", tmp_path) == 2
    assert "HTTP 404" in one_error_line(capsys)


def test_nothing_listening_gets_one_line(tmp_path, capsys):
    assert bench(f"http://127.0.0.1:{free_port()}/v1", tmp_path) == 2
    assert "no server answered" in one_error_line(capsys)


def test_the_model_id_comes_from_the_server(server):
    from specdec.serving.loadgen import resolve_server

    assert resolve_server(server.url + "/v1/") == (server.url, [MODEL])
