"""Logits processors and logprobs with speculation on: penalties, logit_bias and grammar
masks leave greedy speculative output equal to plain decoding token for token (fp32), and
every emitted token's logprob equals the one plain decoding reports, and a teacher-forced
reference computed here from the transformers model."""

import json

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.engine import Engine
from specdec.errors import InvalidParameterError
from specdec.params import Grammar, SamplingParams
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80], [33]]
EOS = frozenset({1})
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yy"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
PENALISED = dict(presence_penalty=1.5, frequency_penalty=0.7, logit_bias={7: 4.0, 9: -100})


@pytest.fixture(scope="module")
def models():
    hf = hf_tiny("qwen2")
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    return hf, native_from_hf(hf), draft


def engines(models, tokenizer, acceptor, drafter="model", k=4):
    _, target, draft = models
    plain = Engine(target, tokenizer, EOS)
    if drafter == "model":
        factory = lambda b, n: DraftModelDrafter(draft, 97, 97, b, n)  # noqa: E731
    elif drafter == "self":  # the target drafting for itself: drafts the processors decide
        factory = lambda b, n: DraftModelDrafter(target, 97, 97, b, n)  # noqa: E731
    else:
        factory = lambda b, n: NgramDrafter()  # noqa: E731
    spec = Engine(
        target, tokenizer, EOS, drafter_factory=factory, acceptor=acceptor, window=FixedWindow(k)
    )
    return plain, spec


CASES = {
    "penalties": dict(**PENALISED),
    "grammar": dict(grammar=Grammar("json_schema", json.dumps(SCHEMA))),
    "json_object+bias": dict(grammar=Grammar("json_object"), logit_bias={20: 3.0}),
    # Done after two letters: EOS alone from then on, drafts of EOS after EOS included.
    "grammar done, ignore_eos": dict(grammar=Grammar("regex", "[a-c]{2}"), ignore_eos=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("drafter", ["model", "self", "ngram"])
@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
def test_greedy_speculative_equals_plain(models, tokenizer, case, drafter, acceptor):
    params = SamplingParams(temperature=0, max_tokens=30, logprobs=3, **CASES[case])
    plain, spec = engines(models, tokenizer, acceptor, drafter)
    want, got = plain.generate(PROMPTS, params), spec.generate(PROMPTS, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for w, g in zip(want, got, strict=True):
        assert len(g.logprobs) == len(g.token_ids)
        assert [e.token for e in g.logprobs] == g.token_ids
        for a, b in zip(w.logprobs, g.logprobs, strict=True):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]
    if drafter == "self":  # the same model drafts: the processed drafts are all kept
        assert sum(c.stats.accepted for c in got) > 0


def test_processors_change_the_output(models, tokenizer):
    plain, _ = engines(models, tokenizer, GreedyAcceptor())
    base = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=30))
    out = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=30, **PENALISED))
    assert [c.token_ids for c in out] != [c.token_ids for c in base]
    assert all(9 not in c.token_ids for c in out)  # a bias of -100 forbids it


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_grammar_output_parses_and_validates(models, tokenizer, drafter):
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=60, grammar=CASES["grammar"]["grammar"])
        for s in range(6)
    ]
    _, spec = engines(models, tokenizer, RejectionSampler(), drafter)
    for c in spec.generate([PROMPTS[0]] * 6, params):
        value = json.loads(c.text)
        assert set(value) == {"a", "b"} and isinstance(value["a"], int)
        assert value["b"] in {"x", "yy"}
        assert c.finish_reason == "stop"


def reference_logprobs(hf, prompt, output, params):
    """Teacher-forced: the transformers model's logits over prompt + output, with the
    penalties and bias written out here, under the request's temperature/top-k/top-p."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = hf(ids).logits[0, len(prompt) - 1 : -1].float()  # [n, V]
    bias = torch.zeros(logits.shape[1])
    for t, b in params.logit_bias:
        bias[t] = b
    rows = []
    for j in range(len(output)):
        counts = torch.bincount(torch.tensor(output[:j], dtype=torch.long), minlength=97).float()
        row = logits[j] + bias - params.frequency_penalty * counts
        row = row - params.presence_penalty * (counts > 0).float()
        row = row / params.temperature
        if params.top_k:
            row[row < row.topk(params.top_k).values[-1]] = float("-inf")
        rows.append(torch.log_softmax(row, -1))
    return torch.stack(rows)


@pytest.mark.parametrize("acceptor", [RejectionSampler(), GreedyAcceptor()])
@pytest.mark.parametrize("top_k", [0, 10])
def test_sampled_logprobs_equal_a_teacher_forced_reference(models, tokenizer, acceptor, top_k):
    hf = models[0]
    params = [
        SamplingParams(temperature=0.8, top_k=top_k, seed=s, max_tokens=20, logprobs=5, **PENALISED)
        for s in range(3)
    ]
    _, spec = engines(models, tokenizer, RejectionSampler(), "self", k=3)
    for prompt, p, c in zip(PROMPTS, params, spec.generate(PROMPTS, params), strict=True):
        ref = reference_logprobs(hf, prompt, c.token_ids, p)  # [n, V]
        got = torch.tensor([e.logprob for e in c.logprobs])
        want = ref.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        for e, r in zip(c.logprobs, ref, strict=True):
            assert [t for t, _ in e.top][:3] == r.topk(3).indices.tolist()


def test_bad_parameters_are_refused(models, tokenizer):
    plain, _ = engines(models, tokenizer, GreedyAcceptor())
    with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
        plain.add_request([5], SamplingParams(logit_bias={97: 1.0}))
    with pytest.raises(InvalidParameterError, match="does not compile"):
        plain.add_request([5], SamplingParams(grammar=Grammar("json_schema", '{"type": "foo"}')))
    with pytest.raises(InvalidParameterError, match="does not compile"):
        plain.add_request([5], SamplingParams(grammar=Grammar("json_schema", "{not json")))
    with pytest.raises(InvalidParameterError, match=r"\[-100, 100\]"):
        SamplingParams(logit_bias={3: 101})
    with pytest.raises(InvalidParameterError, match="top_logprobs"):
        SamplingParams(logprobs=21)
    assert not plain.has_work


@pytest.mark.parametrize("case", ["penalties", "grammar"])
@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()], ids=["greedy", "rs"])
def test_candidate_trees_see_their_own_paths(models, tokenizer, case, acceptor):
    """A tree's node is processed after its ancestors (not after the nodes before it in the
    flat order): scripted heads put the processed continuation at rank 1 of each level, so
    the best-scoring path is wrong and only the per-path processing keeps all of it."""
    from test_speculator_tree import HEADS, TREE, ScriptedTreeSpeculator

    from specdec.drafters import SpeculatorDrafter

    _, target, _ = models
    prompts = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80]]
    params = SamplingParams(temperature=0, max_tokens=25, logprobs=2, **CASES[case])
    want = Engine(target, tokenizer, EOS).generate(prompts, params)
    refs = [c.token_ids for c in want]
    heads = ScriptedTreeSpeculator(target, prompts, refs, lambda i: True)
    heads.strict = False  # a row that finished early has no reference past its end
    engine = Engine(
        target,
        tokenizer,
        EOS,
        drafter_factory=lambda b, n: SpeculatorDrafter(heads, b, tree=TREE, n_candidates=12),
        acceptor=acceptor,
        window=FixedWindow(5),
        max_tree_nodes=12 * HEADS,
    )
    got = engine.generate(prompts, params)
    assert [c.token_ids for c in got] == refs
    assert sum(c.stats.accepted for c in got) >= sum(len(r) - 1 for r in refs) // 2
    for w, g in zip(want, got, strict=True):
        for a, b in zip(w.logprobs, g.logprobs, strict=True):
            assert b.token == a.token and b.logprob == pytest.approx(a.logprob, abs=1e-4)
