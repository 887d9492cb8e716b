"""Plain greedy decoding on the native model == transformers' greedy `generate`, in fp32."""

from specdec.bench.peers import hf_greedy
from specdec.engine import Engine
from specdec.params import SamplingParams

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33]]


def test_greedy_matches_transformers_generate(hf_and_native, tokenizer):
    hf, native = hf_and_native
    engine = Engine(native, tokenizer, eos_ids=frozenset({1}))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for prompt in PROMPTS:
        assert engine.generate([prompt], params)[0].token_ids == hf_greedy(hf, prompt, 24)


def test_batched_ragged_greedy_equals_each_prompt_alone(hf_and_native, tokenizer):
    _, native = hf_and_native
    engine = Engine(native, tokenizer, eos_ids=frozenset({1}))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (20, 7, 13)]
    batched = engine.generate(PROMPTS, params)
    alone = [engine.generate([p], q)[0] for p, q in zip(PROMPTS, params, strict=True)]
    assert [c.token_ids for c in batched] == [c.token_ids for c in alone]
    assert [c.num_generated for c in batched] == [20, 7, 13]
    assert all(c.finish_reason == "length" for c in batched)
