"""Fixtures: the tiny models on disk, a server over them, offline reference outputs."""

import pytest

from specdec.llm import LLM
from specdec.params import SamplingParams

from tiny_server import Server, save_tiny, serve_args


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-models")
    return save_tiny(root / "target", 0), save_tiny(root / "draft", 1, num_hidden_layers=1)


@pytest.fixture(scope="module")
def server(model_dirs):
    srv = Server(*serve_args(model_dirs))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def offline(model_dirs):
    """Greedy reference outputs from the offline engine (plain decoding, no server)."""
    llm = LLM(str(model_dirs[0]), dtype="fp32")

    def run(prompt: str, max_tokens: int, chat: bool = False, **params) -> str:
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, **params)
        return llm.generate([prompt], sp, chat=chat)[0].text

    return run
