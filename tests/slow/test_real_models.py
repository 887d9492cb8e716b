"""Real models (pulled on first use): native logits and greedy output == transformers'."""

import pytest
import torch
import transformers

from specdec.bench.peers import hf_greedy
from specdec.engine import Engine
from specdec.models.loading import load_transformer
from specdec.params import SamplingParams
from specdec.tokenization import encode_prompt, eos_token_ids, load_tokenizer

pytestmark = pytest.mark.slow

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
PROMPT = "Write a Python function that checks whether a number is prime."


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    from specdec.hub import resolve

    path = resolve(request.param, "fp32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    native = load_transformer(path, "fp32")
    tokenizer = load_tokenizer(path)
    yield path, hf, native, tokenizer
    del hf, native


def test_logits_match_transformers(pair):
    _, hf, native, tokenizer = pair
    ids = torch.tensor([encode_prompt(tokenizer, PROMPT, chat=True)])
    with torch.inference_mode():
        expected = hf(ids).logits
        got = native(ids, native.new_cache(1, ids.shape[1])).logits
    diff = (expected - got).abs().max().item()
    assert diff < 1e-3, diff
    assert (expected.argmax(-1) == got.argmax(-1)).all()


def test_greedy_matches_transformers_generate(pair):
    path, hf, native, tokenizer = pair
    prompt = encode_prompt(tokenizer, PROMPT, chat=True)
    n = 32
    ref = hf_greedy(hf, prompt, n)
    engine = Engine(native, tokenizer, eos_token_ids(path, tokenizer))
    ours = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    assert ours[0].token_ids == ref


@pytest.mark.parametrize("draft_quant", ["none", "int4"])
def test_speculative_greedy_equals_plain_on_the_default_pair_fp32(draft_quant):
    """The real pair in fp32: speculative output is plain greedy output, token for token."""
    from specdec.data import sharegpt_prompts
    from specdec.llm import LLM

    llm = LLM(
        "qwen2.5-coder-1.5b-instruct",
        draft="qwen2.5-coder-0.5b-instruct",
        speculate=4,
        draft_quant=draft_quant,
        dtype="fp32",
        max_batch=2,
    )
    prompts = [llm.encode(p, chat=True) for p in [PROMPT, *sharegpt_prompts(1, seed=0)]]
    params = SamplingParams(temperature=0, max_tokens=48)
    plain = llm.plain_engine().generate(prompts, params)
    spec = llm.engine.generate(prompts, params)
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    assert all(c.stats.acceptance_rate > 0.3 for c in spec)
