"""Greedy output with an EAGLE-3 head drafting (chains and trees, rows joining mid-run) is
exactly plain greedy's in fp32, and a head fitted to the target keeps drafts."""

import pytest
import torch
import torch.nn.functional as F

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.engine import Engine
from specdec.heads.eagle3 import build_eagle3
from specdec.params import SamplingParams
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 25


@pytest.fixture(scope="module")
def setup(tokenizer):
    """(target, plain greedy outputs, params, a head fitted to them). One thread, as the
    tests run (module fixtures come before conftest's per-test setting; two threads on a
    loaded 2-vCPU host made this fit take minutes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fitted(tokenizer)
    finally:
        torch.set_num_threads(threads)


def _fitted(tokenizer):
    target = native_from_hf(hf_tiny("qwen2", num_hidden_layers=4))
    params = SamplingParams(temperature=0, max_tokens=N)
    refs = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(PROMPTS, params)]
    torch.manual_seed(0)
    head = build_eagle3(target, intermediate_size=64, n_predict=4, aux_layer_ids=(1, 2, 3))
    seqs = [torch.tensor([p + r]) for p, r in zip(PROMPTS, refs, strict=True)]
    with torch.no_grad():
        data = []
        for s in seqs:
            out = target(s, target.new_cache(1, s.shape[1] + 1), aux_layers=(1, 2, 3))
            data.append((s, out.aux, out.logits.argmax(-1)[0]))  # the target's choices
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(80):
        loss = 0
        for s, aux, labels in data:
            T = s.shape[1] - 1
            preds = head.unrolled(s[:, 1:], aux[:, :-1], torch.arange(T)[None], 2)
            for step, p in enumerate(preds):  # step i+1 at p predicts the choice after p+1
                logits = head.logits(p[0, step : T - 1])
                loss = loss + F.cross_entropy(logits, labels[step + 1 : T])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return target, refs, params, head.eval().requires_grad_(False)


def engine(target, tokenizer, make, max_batch, acceptor, window, max_nodes=None):
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=make,
        acceptor=acceptor,
        window=FixedWindow(window),
        **({} if max_nodes is None else {"max_tree_nodes": max_nodes}),
    )


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
@pytest.mark.parametrize("max_batch", [8, 2])
def test_eagle3_chains_leave_greedy_output_exact(setup, tokenizer, acceptor, max_batch):
    target, refs, params, head = setup
    make = lambda b, length: Eagle3Drafter(head, b, length)  # noqa: E731
    out = engine(target, tokenizer, make, max_batch, acceptor, 6).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    passes = sum(c.stats.steps for c in out)
    assert passes < len(PROMPTS) * (N - 1) / 2.5  # the fitted head keeps drafts


def test_eagle3_int4_drafting_form_leaves_greedy_output_exact(setup, tokenizer):
    """The 4-bit drafting form (what `LLM` drafts with on a CPU) proposes from other
    weights; the output stays plain's, and it still keeps drafts."""
    import copy

    target, refs, params, head = setup
    int4 = copy.deepcopy(head).for_drafting("int4")
    make = lambda b, length: Eagle3Drafter(int4, b, length)  # noqa: E731
    out = engine(target, tokenizer, make, 2, GreedyAcceptor(), 4).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    assert sum(c.stats.steps for c in out) < len(PROMPTS) * (N - 1) / 2


def test_an_engine_asked_for_static_passes_runs_eagle3_on_its_eager_ones(setup, tokenizer):
    """Fixed-shape passes keep no layer inputs: with a drafter that reads them the engine
    runs the target's eager passes, and the output is plain's."""
    target, refs, params, head = setup
    eng = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=2,
        drafter_factory=lambda b, length: Eagle3Drafter(head, b, length),
        acceptor=GreedyAcceptor(),
        window=FixedWindow(4),
        static_passes=True,
    )
    assert [c.token_ids for c in eng.generate(PROMPTS, params)] == refs
    assert eng._target is target


@pytest.mark.parametrize("tree", [(3, 2, 1), (2, 2, 2, 2)], ids=["321", "2222-beam4"])
def test_eagle3_trees_leave_greedy_output_exact(setup, tokenizer, tree):
    target, refs, params, head = setup
    n_candidates = 4 if len(tree) == 4 else None
    make = lambda b, length: Eagle3Drafter(head, b, length, tree, n_candidates)  # noqa: E731
    eng = engine(target, tokenizer, make, 2, GreedyAcceptor(), len(tree), make(1, 8).max_nodes)
    out = eng.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs


@pytest.mark.parametrize("tree", [None, (3, 2, 1)], ids=["chain", "tree"])
def test_eagle3_rows_joining_mid_run_leave_greedy_output_exact(setup, tokenizer, tree):
    target, refs, params, head = setup
    make = lambda b, length: Eagle3Drafter(head, b, length, tree)  # noqa: E731
    nodes = None if tree is None else make(1, 8).max_nodes
    eng = engine(target, tokenizer, make, 3, GreedyAcceptor(), 3, nodes)
    seqs = staggered(eng, PROMPTS, [params] * len(PROMPTS))
    assert [s.output_ids for s in seqs] == refs


def test_eagle3_prompts_reusing_a_stored_prefix_draft_as_a_full_prefill_does(setup, tokenizer):
    """The engine's prefix store skips a shared prompt start; the drafter restores the
    auxiliary states of the skipped positions from its own store, so its drafts (and the
    passes they take) are those of a run without the store, and the output is plain's."""
    target, _, params, head = setup
    common = [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44, 17, 42, 8, 5]
    prompts = [common + [7], common + [33, 8]]
    plain = Engine(target, tokenizer, frozenset()).generate(prompts, params)

    def run(store_tokens):
        eng = Engine(
            target,
            tokenizer,
            frozenset(),
            drafter_factory=lambda b, length: Eagle3Drafter(head, b, length),
            acceptor=GreedyAcceptor(),
            window=FixedWindow(3),
            prefix_cache_tokens=store_tokens,
        )
        outs = [eng.generate([p], params)[0] for p in prompts]  # the second reuses the first
        return [c.token_ids for c in outs], [c.stats.steps for c in outs], outs

    tokens, steps, outs = run(4096)
    assert outs[1].stats.cached_tokens > 0
    assert tokens == [c.token_ids for c in plain]
    assert (tokens, steps) == run(0)[:2]
