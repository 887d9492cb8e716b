"""A server stopped with SIGTERM (what a process manager sends) shuts down gracefully and
still writes what it keeps at exit: `auto`'s measured costs (and a learner's heads, through
the same `finally`), with status 143."""

import httpx

from tiny_server import Server, serve_args


def test_sigterm_unwinds_and_stores_the_costs(model_dirs, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.setenv("SPECDEC_COST_CACHE", "1")
    args = [a if a != "3" else "auto" for a in serve_args(model_dirs)]  # --speculate auto
    srv = Server(*args, "--tune-budget", "0")
    reply = httpx.post(
        srv.url + "/v1/completions",
        json={"model": "tiny", "prompt": "abc", "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert reply.status_code == 200
    srv.stop()  # SIGTERM to the process group
    assert srv.proc.returncode == 143
    assert len(list((home / "costs").glob("*.json"))) == 1
