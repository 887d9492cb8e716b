"""End to end through `Engine`: speculative sampling emits the same sequence distribution as
plain sampling of the target.

Tiny random fp32 models whose lm_head is scaled up so that next-token distributions are
concentrated; the draft is the target with noise on every weight, so p and q overlap
(acceptance ~0.45-0.5) without being equal, and both the accept and the residual paths are
taken. Many seeded requests of a fixed prompt sample short continuations, once plainly and
once speculatively (k = 3), and a chi-square homogeneity test compares the two empirical
joint distributions. The two arms use disjoint seeds: with equal seeds both arms would
draw the same first token (the prefill is plain sampling in both), and the samples would not
be independent. A biased acceptor in the same engine fails the same test.
"""

import copy
import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from specdec.acceptors import Draft, RejectionSampler, Verdict
from specdec.drafters import DraftModelDrafter
from specdec.drafters.draft_vocab import prune_vocab_head
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.suffix import SuffixDrafter, SuffixStore
from specdec.engine import Engine
from specdec.params import Grammar, SamplingParams
from specdec.stats import SpecStats
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf

PROMPT = [5, 17, 42, 8]
N = 6144  # requests per arm
MAX_BATCH = 64
PASS, FAIL = 1e-3, 1e-6
SHARPEN = 15.0  # lm_head scale: logits with std ~2.4 instead of ~0.16
NOISE = 0.15  # draft weights = target weights + NOISE * std(weight) * N(0, 1)

# The engine drafts at most max_tokens - 1 - (tokens so far) per row, so a 3-token request
# speculates one draft token (plus the bonus) after the prefill's first token.
CASES = {
    "top-k 4, 3 tokens": dict(top_k=4, max_tokens=3),
    "t 0.7, top-p 0.9, 3 tokens": dict(temperature=0.7, top_p=0.9, max_tokens=3),
    # Four tokens: some requests take a second speculative step after a rejection, which
    # exercises the draft model's rollback and pending tokens.
    "top-k 3, 4 tokens": dict(top_k=3, max_tokens=4),
    # Six tokens at k = 4: the first speculative step verifies four drafted positions.
    "top-k 2, 6 tokens, k = 4": dict(top_k=2, max_tokens=6),
    # Penalties and a bias through the engine's processors (each position after the
    # drafts before it), and a grammar mask (letters a-e, EOS once done: ignored).
    "penalties, top-k 3, 4 tokens": dict(
        top_k=3, max_tokens=4, presence_penalty=1.0, frequency_penalty=1.0, logit_bias={40: 2.0}
    ),
    "grammar, t 0.8, 4 tokens": dict(
        temperature=0.8, max_tokens=4, grammar=Grammar("regex", "[a-e]{1,3}")
    ),
}
WINDOWS = {name: 4 for name in CASES if name.endswith("k = 4")}  # else k = 3
# Fewer requests where the processors' per-row work (or six tokens) makes an arm slow.
ARM_N = {
    "top-k 2, 6 tokens, k = 4": N // 2,
    "penalties, top-k 3, 4 tokens": N // 2,
    "grammar, t 0.8, 4 tokens": N // 2,
}


def sharp_tiny():
    hf = hf_tiny("llama", seed=0)
    with torch.no_grad():
        hf.lm_head.weight.mul_(SHARPEN)
    return hf


@pytest.fixture(scope="module")
def models():
    # A second copy for the draft: `native_from_hf` shares storage with the HF weights.
    target, draft = sharp_tiny(), sharp_tiny()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * NOISE * p.std())
    return native_from_hf(target), native_from_hf(draft)


def sequences(engine: Engine, sampling: dict, first_seed: int, n: int = N) -> Counter:
    params = [SamplingParams(seed=first_seed + i, ignore_eos=True, **sampling) for i in range(n)]
    out = engine.generate([PROMPT] * n, params)
    assert all(len(c.token_ids) == sampling["max_tokens"] for c in out)
    counts = Counter(tuple(c.token_ids) for c in out)
    drafted = sum(c.stats.drafted for c in out)
    counts["acceptance"] = sum(c.stats.accepted for c in out) / max(drafted, 1)
    # per draft position: how many steps tested it and how many kept it
    counts["drafted at"] = tuple(sum((c.stats for c in out), SpecStats()).drafted_at)
    counts["kept at"] = tuple(sum((c.stats for c in out), SpecStats()).accepted_at)
    return counts


def plain_engine(target, tokenizer) -> Engine:
    return Engine(target, tokenizer, frozenset(), max_batch=MAX_BATCH)


def spec_engine(target, draft, tokenizer, acceptor, drafter=DraftModelDrafter, k=3, **options):
    """k-token speculation with `drafter(draft, ...)` (`options` go to the drafter)."""
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=MAX_BATCH,
        drafter_factory=lambda b, n: drafter(draft, 97, 97, b, n, **options),
        acceptor=acceptor,
        window=FixedWindow(k),
    )


def homogeneity(a: Counter, b: Counter, min_count: int = 10) -> float:
    """p-value of chi-square homogeneity; outcomes rarer than `min_count` in both arms
    together are pooled into one cell."""
    outcomes = sorted(o for o in set(a) | set(b) if isinstance(o, tuple))
    common = [o for o in outcomes if a[o] + b[o] >= min_count]
    rare = [o for o in outcomes if a[o] + b[o] < min_count]
    table = [[a[o] for o in common], [b[o] for o in common]]
    if rare:
        table[0].append(sum(a[o] for o in rare))
        table[1].append(sum(b[o] for o in rare))
    return float(chi2_contingency(np.array(table)).pvalue)


@pytest.fixture(scope="module")
def plain_counts(models, tokenizer):
    """The plain arm of each case, computed once (seeds 0 .. N-1)."""
    cache = {}

    def get(name):
        if name not in cache:
            n = ARM_N.get(name, N)
            cache[name] = sequences(plain_engine(models[0], tokenizer), CASES[name], 0, n)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_speculative_sampling_matches_plain_sampling(models, tokenizer, plain_counts, name):
    target, draft = models
    plain = plain_counts(name)
    k = WINDOWS.get(name, 3)
    engine = spec_engine(target, draft, tokenizer, RejectionSampler(), k=k)
    n = ARM_N.get(name, N)
    spec = sequences(engine, CASES[name], n, n)
    value = homogeneity(plain, spec)
    print(name, f"p = {value:.3g}", f"outcomes {len(plain) - 1}", f"acc {spec['acceptance']}")
    assert value > PASS
    assert 0.2 < spec["acceptance"] < 0.8  # both the accept and the residual paths are taken
    if name.startswith("top-k 4"):
        sequences_seen = [o for o in set(plain) | set(spec) if isinstance(o, tuple)]
        assert len(sequences_seen) <= 4**3  # three tokens, each among the top 4
    if k == 4:  # steps verified four drafted positions, and some kept all four
        assert len(spec["drafted at"]) == 4 and spec["drafted at"][3] > 500
        assert spec["kept at"][3] > 100
    if name.startswith("grammar"):
        outcomes = [o for o in set(plain) | set(spec) if isinstance(o, tuple)]
        texts = [tokenizer.decode(list(o), skip_special_tokens=True) for o in outcomes]
        assert all(text and set(text) <= set("abcde") for text in texts)


# ---- a draft model whose vocabulary head is cut to some ids -----------------------------

PRUNED_CASE = "t 0.7, top-p 0.9, 3 tokens"


class UnnormalisedPrunedDrafter(DraftModelDrafter):
    """A wrong cut head: q reported as the kept ids' share of a full softmax (here half of
    the renormalised q) instead of the softmax over the kept ids that it samples from."""

    def propose(self, k, params, generators):
        draft = super().propose(k, params, generators)
        probs = None if draft.probs is None else draft.probs * 0.5
        return Draft(draft.tokens, probs, draft.lengths)


def pruned_engine(target, draft, tokenizer, drafter=DraftModelDrafter) -> Engine:
    cut = copy.deepcopy(draft)
    ids = torch.arange(0, 97, 2)  # half the ids: the target often samples one of the others
    prune_vocab_head(cut, ids)
    return spec_engine(target, cut, tokenizer, RejectionSampler(), drafter, vocab=ids)


def test_pruned_draft_vocabulary_keeps_the_target_distribution(models, tokenizer, plain_counts):
    target, draft = models
    spec = sequences(pruned_engine(target, draft, tokenizer), CASES[PRUNED_CASE], N)
    value = homogeneity(plain_counts(PRUNED_CASE), spec)
    print("pruned", f"p = {value:.3g}", f"acc {spec['acceptance']}")
    assert value > PASS
    assert 0.1 < spec["acceptance"] < 0.8


def test_unnormalised_pruned_q_fails(models, tokenizer, plain_counts):
    target, draft = models
    engine = pruned_engine(target, draft, tokenizer, UnnormalisedPrunedDrafter)
    value = homogeneity(plain_counts(PRUNED_CASE), sequences(engine, CASES[PRUNED_CASE], N))
    print("unnormalised", f"p = {value:.3g}")
    assert value < FAIL


# ---- a biased acceptor in the same engine fails the same test --------------------------


class ResampleFromPLossy:
    """Decides acceptance like rejection sampling, but at a rejection draws from p instead of
    the residual max(0, p - q)."""

    lossless = False

    def __call__(self, draft, target_probs, generators) -> Verdict:
        verdict = RejectionSampler()(draft, target_probs, generators)
        n = verdict.num_accepted
        rows = torch.arange(len(n))
        p_next = target_probs[rows, n]  # [B, V]
        resampled = torch.cat(
            [torch.multinomial(p_next[b], 1, generator=g) for b, g in enumerate(generators)]
        )
        tokens = verdict.tokens.clone()
        rejected = n < draft.lengths
        tokens[rows, n] = torch.where(rejected, resampled, tokens[rows, n])
        return Verdict(tokens, n)


class AlwaysAcceptLossy:
    """Keeps every draft token; samples the bonus token from p (so its prefill is right)."""

    lossless = False

    def __call__(self, draft, target_probs, generators) -> Verdict:
        k = draft.k
        bonus = torch.cat(
            [
                torch.multinomial(target_probs[b, k], 1, generator=g)
                for b, g in enumerate(generators)
            ]
        )
        return Verdict(torch.cat([draft.tokens, bonus[:, None]], 1), draft.lengths.clone())


@pytest.mark.parametrize(
    "acceptor,name",
    [
        (ResampleFromPLossy, "top-k 4, 3 tokens"),
        (ResampleFromPLossy, "t 0.7, top-p 0.9, 3 tokens"),
        (AlwaysAcceptLossy, "top-k 4, 3 tokens"),
        (ResampleFromPLossy, "top-k 2, 6 tokens, k = 4"),
        (ResampleFromPLossy, "penalties, top-k 3, 4 tokens"),
        (ResampleFromPLossy, "grammar, t 0.8, 4 tokens"),
    ],
)
def test_biased_acceptor_fails(models, tokenizer, plain_counts, acceptor, name):
    target, draft = models
    engine = spec_engine(target, draft, tokenizer, acceptor(), k=WINDOWS.get(name, 3))
    n = ARM_N.get(name, N)
    spec = sequences(engine, CASES[name], n, n)
    value = homogeneity(plain_counts(name), spec)
    print(acceptor.__name__, name, f"p = {value:.3g}")
    assert value < FAIL


# ---- candidate trees: recursive rejection sampling over several children ----------------

TREE_CASE = "top-k 3, 4 tokens"
N_TREE = N // 2  # requests per tree arm (against the plain arm's N): keeps the suite quick


class OracleTreeHeads:
    """Speculator heads for `SpeculatorDrafter(tree=...)` that draft with the noisy draft
    model: they find the history from the target state `observe` gave them (every prefix
    a top-3 sampler can reach is tabulated, so a state from a wrongly compacted cache
    fails), then take the draft model's top-k at every level. Deterministic in the
    history, as real heads are."""

    def __init__(self, target, draft):
        from specdec.heads import SpeculatorConfig
        from specdec.training.target import TargetStates

        self.config = SpeculatorConfig(2, 64, 64, 97, 97)
        self.proj = [torch.nn.Linear(1, 1)]
        self.draft = draft
        self._topk: dict[tuple[int, ...], torch.Tensor] = {}
        prefixes = [tuple(PROMPT)]
        for _ in range(3):
            prefixes = [
                p + (t,) for p in prefixes for t in self._logp(target, p).topk(3)[1].tolist()
            ]
        states, self.prefixes = TargetStates(target), []
        rows = []
        for seq in prefixes:
            h = states(torch.tensor([seq]))[0]  # [S, E]
            for pos in range(len(PROMPT) - 1, len(seq)):
                rows.append(h[pos])
                self.prefixes.append(seq[: pos + 1])
        self.states = torch.stack(rows)

    @staticmethod
    @torch.inference_mode()
    def _logp(model, context) -> torch.Tensor:
        cache = model.new_cache(1, 16)
        logits = model(torch.tensor([list(context)]), cache).logits[0, -1]
        return torch.log_softmax(logits, -1)

    def _draft_topk(self, context, k):
        if context not in self._topk:
            self._topk[context] = self._logp(self.draft, context).topk(4)
        values, ids = self._topk[context]
        return values[:k].tolist(), [int(t) for t in ids[:k]]

    def propose_tree(self, hidden, last, topk):
        B, P = len(hidden), math.prod(topk)
        paths = torch.zeros(B, P, len(topk), dtype=torch.long)
        scores = torch.zeros(B, P)
        dist = (hidden.float()[:, None] - self.states[None]).norm(dim=-1)  # [B, S]
        for b in range(B):
            found = int(dist[b].argmin())
            assert float(dist[b, found]) < 1e-4, "observe() gave a state of no reachable prefix"
            rows = [((*self.prefixes[found], int(last[b])), (), 0.0)]
            for k in topk:
                rows = [
                    (ctx + (t,), path + (t,), score + lp)
                    for ctx, path, score in rows
                    for lp, t in zip(*self._draft_topk(ctx, k), strict=True)
                ]
            paths[b] = torch.tensor([path for _, path, _ in rows])
            scores[b] = torch.tensor([score for _, _, score in rows])
        return paths, scores


def tree_engine(target, draft, tokenizer, tree_acceptor=None) -> Engine:
    from specdec.drafters import SpeculatorDrafter

    heads = OracleTreeHeads(target, draft)
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=MAX_BATCH,
        drafter_factory=lambda b, n: SpeculatorDrafter(heads, b, tree=(3, 2), n_candidates=4),
        window=FixedWindow(2),
        max_tree_nodes=8,
        tree_acceptor=tree_acceptor,
    )


class IndependentChildrenLossy:
    """Tests each child with its own p (no residual after a rejected sibling) and, when all
    are rejected, samples from p instead of the residual: the natural mistake."""

    lossless = False

    def __call__(self, trees, probs, greedy, generators):
        paths, nexts = [], []
        for b, (tree, g) in enumerate(zip(trees, generators, strict=True)):
            node, path = -1, []
            while True:
                p = probs[b, node + 1]
                children = [i for i, q in enumerate(tree.parents) if q == node]
                chosen = next(
                    (c for c in children if float(torch.rand(1, generator=g)) < p[tree.tokens[c]]),
                    None,
                )
                if chosen is None:
                    break
                path.append(chosen)
                node = chosen
            paths.append(path)
            nexts.append(int(torch.multinomial(probs[b, node + 1], 1, generator=g)))
        return paths, nexts


def test_tree_sampling_matches_plain_sampling(models, tokenizer, plain_counts):
    target, draft = models
    spec = sequences(tree_engine(target, draft, tokenizer), CASES[TREE_CASE], N, N_TREE)
    value = homogeneity(plain_counts(TREE_CASE), spec)
    print("tree", f"p = {value:.3g}", f"acc {spec['acceptance']}")
    assert value > PASS
    # Depth-2 trees, of which the engine verifies what max_tokens leaves (drafted counts
    # the deepest path): both acceptance and the residual are frequent.
    assert 0.3 < spec["acceptance"] < 0.8


def test_biased_tree_rule_fails(models, tokenizer, plain_counts):
    target, draft = models
    engine = tree_engine(target, draft, tokenizer, IndependentChildrenLossy())
    value = homogeneity(plain_counts(TREE_CASE), sequences(engine, CASES[TREE_CASE], N, N_TREE))
    print("IndependentChildrenLossy", f"p = {value:.3g}")
    assert value < FAIL


# ---- the suffix drafter: point-mass drafts learnt from the earlier requests' samples -------

SUFFIX_CASE = "top-k 3, 4 tokens"


def suffix_engine(target, tokenizer, acceptor) -> Engine:
    """k = 3 from one `SuffixStore` for the whole arm: each request drafts the most
    frequent continuation of the requests that finished before it (a point mass)."""
    store = SuffixStore()
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=MAX_BATCH,
        drafter_factory=lambda b, n: SuffixDrafter(store, min_match=1),
        acceptor=acceptor,
        window=FixedWindow(3),
    )


def test_suffix_drafter_sampling_matches_plain_sampling(models, tokenizer, plain_counts):
    spec = sequences(suffix_engine(models[0], tokenizer, RejectionSampler()), CASES[SUFFIX_CASE], N)
    value = homogeneity(plain_counts(SUFFIX_CASE), spec)
    print("suffix", f"p = {value:.3g}", f"acc {spec['acceptance']}")
    assert value > PASS
    assert 0.2 < spec["acceptance"] < 0.95  # drafts are accepted and rejected


def test_suffix_drafter_with_a_biased_acceptor_fails(models, tokenizer, plain_counts):
    spec = sequences(
        suffix_engine(models[0], tokenizer, ResampleFromPLossy()), CASES[SUFFIX_CASE], N
    )
    value = homogeneity(plain_counts(SUFFIX_CASE), spec)
    print("suffix, biased", f"p = {value:.3g}")
    assert value < FAIL


# ---- suffix decoding combined with a draft model: each row's q from its own drafter -------

HYBRID_CASE = "top-k 3, 4 tokens"


class SuffixLeaningHybrid(HybridDrafter):
    """Takes the suffix's draft wherever it has one on rows whose history has an even
    length (the real rule leaves the suffix few rows here: its drafts of diverse samples
    rate low): the choice still depends only on the past, so the output must still be
    the target's, while both drafters draft many rows, often in the same step."""

    def takes_suffix(self, row, kind, expected, bar) -> bool:
        return len(self.suffix.tokens(row)) % 2 == 0


class ModelQOnSuffixRowsHybrid(SuffixLeaningHybrid):
    """A wrong hybrid: rows drafted by the suffix keep the draft model's q (the suffix's
    tokens judged against a distribution that did not draft them), not a one-hot q."""

    def _joined(self, other, rows):
        joined = super()._joined(other, rows)
        if joined.probs is not None and other.probs is not None:
            joined.probs[:, : other.k] = other.probs
        return joined


def hybrid_engine(target, draft, tokenizer, cls=SuffixLeaningHybrid):
    """k = 3 over one `SuffixStore` for the arm and the noisy draft model; returns the
    engine and the hybrids it built (to count which drafter drafted)."""
    store, made = SuffixStore(), []

    def factory(b, n):
        made.append(cls(SuffixDrafter(store, min_match=1), DraftModelDrafter(draft, 97, 97, b, n)))
        return made[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=MAX_BATCH,
        drafter_factory=factory,
        acceptor=RejectionSampler(),
        window=FixedWindow(3),
    )
    return engine, made


def test_suffix_hybrid_sampling_matches_plain_sampling(models, tokenizer, plain_counts):
    engine, made = hybrid_engine(*models, tokenizer)
    spec = sequences(engine, CASES[HYBRID_CASE], N)
    value = homogeneity(plain_counts(HYBRID_CASE), spec)
    suffix_rows, model_rows = sum(h.suffix_rows for h in made), sum(h.other_rows for h in made)
    print("hybrid", f"p = {value:.3g}", f"acc {spec['acceptance']}", suffix_rows, model_rows)
    assert value > PASS
    assert suffix_rows > 1000 and model_rows > 1000  # both drafters drafted many rows


def test_suffix_hybrid_with_the_wrong_q_fails(models, tokenizer, plain_counts):
    engine, _ = hybrid_engine(*models, tokenizer, ModelQOnSuffixRowsHybrid)
    value = homogeneity(plain_counts(HYBRID_CASE), sequences(engine, CASES[HYBRID_CASE], N))
    print("hybrid, wrong q", f"p = {value:.3g}")
    assert value < FAIL
