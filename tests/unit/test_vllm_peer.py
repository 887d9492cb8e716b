"""The vLLM peer without vLLM: a stand-in `vllm` package on the worker's path checks the
worker protocol end to end (the real worker script, run by another interpreter), what the
bench records, and that a missing or failing vLLM gives a skipped row that says why."""

import json
import sys
import textwrap

import pytest

from specdec.bench.vllm_peer import VllmError, VllmPeer
from specdec.cli import main

from tiny import hf_tiny, tiny_tokenizer

FAKE_VLLM = '''
import os
from types import SimpleNamespace

class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class LLM:
    """Echoes each prompt's last id + 1, + 2, ...: max_tokens of them, stopping after a
    stop id; records its setup where the test can read it."""
    def __init__(self, **kw):
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("no CPU backend for this model (simulated)")
        print("loading (vLLM's own chatter goes to stderr)")
        with open(os.environ["FAKE_VLLM_SETUP"], "a") as f:
            f.write(repr(sorted(kw)) + " " + repr(kw.get("speculative_config")) + "\\n")

    def generate(self, prompts, params, use_tqdm=True):
        outs = []
        for p in prompts:
            ids, last = [], p["prompt_token_ids"][-1]
            for i in range(params.max_tokens):
                ids.append(last + 1 + i)
                if ids[-1] in params.stop_token_ids and not params.ignore_eos:
                    break
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)]))
        return outs
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    root = tmp_path / "fake-site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    (root / "vllm" / "inputs.py").write_text("def TokensPrompt(**kw):\n    return kw\n")
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("FAKE_VLLM_SETUP", str(tmp_path / "setup.log"))
    return tmp_path / "setup.log"


def test_worker_protocol_end_to_end(fake_vllm, tmp_path):
    peer = VllmPeer(sys.executable, tmp_path, draft=tmp_path / "draft", k=3, threads=2)
    try:
        out = peer.generate([[5, 6], [9]], 4, 0.0, stop_ids=[12], ignore_eos=False, batch=1)
        assert out == [[7, 8, 9, 10], [10, 11, 12]]  # the second stops at its stop id
        assert peer.generate([[9]], 4, 0.0, [12], ignore_eos=True, batch=2) == [[10, 11, 12, 13]]
    finally:
        peer.close()
    setup = fake_vllm.read_text()
    assert "'num_speculative_tokens': 3" in setup and "'method': 'draft_model'" in setup


def test_a_failing_worker_says_why(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    with pytest.raises(VllmError, match="no CPU backend for this model"):
        VllmPeer(sys.executable, tmp_path)
    with pytest.raises(VllmError, match="no Python interpreter at"):
        VllmPeer(tmp_path / "missing" / "python", tmp_path)


def _bench(tmp_path, *extra):
    model = tmp_path / "model"
    hf_tiny("qwen2").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    out = tmp_path / "out"
    argv = ["bench", "--model", str(model), "--draft", str(model), "--dtype", "fp32"]
    argv += ["--draft-quant", "none", "--workloads", "code", "--batches", "1"]
    argv += ["--temperatures", "0", "--max-tokens", "5", "--prompts-per-point", "2"]
    argv += ["--methods", "plain,vllm,vllm-draft-k2", "--out", str(out), *extra]
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    return {r["method"]: r for r in data["rows"]}, data


def test_bench_runs_vllm_plain_and_with_its_draft_model(fake_vllm, tmp_path):
    rows, data = _bench(tmp_path, "--vllm-python", sys.executable, "--ignore-eos")
    for method in ("vllm", "vllm-draft-k2"):
        assert rows[method]["status"] == "ok", rows[method]
        assert rows[method]["generated_tokens"] == 2 * 5 and rows[method]["window"] is None
        assert rows[method]["cpu_tokens_per_s"] is None  # its work is another process's
    assert "--vllm-python" in data["command"]
    assert fake_vllm.read_text().count("\n") == 2  # one worker per setup, loaded once each


def test_bench_without_vllm_skips_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_VLLM_PYTHON", raising=False)
    rows, _ = _bench(tmp_path)
    assert rows["plain"]["status"] == "ok"
    assert rows["vllm"]["status"] == "skipped" and "--vllm-python" in rows["vllm"]["reason"]
