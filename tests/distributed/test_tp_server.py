"""`specdec serve --tp 2` under torchrun: rank 0 serves HTTP, rank 1 follows its steps; the
answers equal the single-process ones."""

import sys

import openai
import pytest

from specdec.llm import LLM
from specdec.params import SamplingParams

from tiny_server import MODEL, Server, save_tiny, serve_args

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-serve")
    return save_tiny(root / "target", 0), save_tiny(root / "draft", 1, num_hidden_layers=1)


@pytest.fixture(scope="module")
def tp_server(models):
    srv = Server(
        *serve_args(models, "--tp", "2"),
        launcher=[*TORCHRUN, "2", "-m", "specdec.cli", "serve"],
    )
    yield srv
    srv.stop()


def test_server_answers_under_tp(tp_server, models):
    client = openai.OpenAI(base_url=tp_server.url + "/v1", api_key="x", max_retries=0)
    args = dict(model=MODEL, prompt="def g(y):", max_tokens=20, temperature=0)
    served = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    llm = LLM(str(models[0]), dtype="fp32")
    offline = llm.generate(["def g(y):"], SamplingParams(temperature=0, max_tokens=20))[0].text
    assert served == streamed == offline
    sampled = dict(model=MODEL, prompt="x", max_tokens=16, temperature=1.0, seed=5)
    first = client.completions.create(**sampled).choices[0].text
    assert client.completions.create(**sampled).choices[0].text == first
    unseeded = client.completions.create(**{**sampled, "seed": None, "n": 2})
    assert len(unseeded.choices) == 2  # ranks agreed on the seeds drawn by rank 0
