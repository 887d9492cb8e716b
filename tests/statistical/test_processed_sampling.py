"""Rejection sampling stays lossless for processed distributions: penalties, logit_bias
and grammar masks, whose p at a draft position depends on the drafts before it.

As `test_rejection_sampling.py` (V = 6, k = 2, chi-square, fixed seeds), but the target's
p at each position comes from the engine's own `RequestProcessor` after the row's drafts
(`p_i = transform(process(TARGET_i, d_0..d_{i-1}))`, tabulated per draft prefix). The
checks are conditional: the first emitted token against p_0; given d_0 kept, the second
against p_1 for that d_0; given both kept, the bonus against p_2 for (d_0, d_1); each a sum
of chi-square statistics over the prefixes. The same checks fail on biased acceptors in
every filtered case (top-k, top-p, penalties, grammar), and on an exact acceptor handed the
distribution a processor gives when it ignores the drafts before a position.
"""

import itertools

import numpy as np
import pytest
import torch
import transformers
from scipy.stats import chi2
from test_rejection_sampling import FAR, NEAR, TARGET, AcceptWithP, ResampleFromP, V

from specdec.acceptors import Draft, RejectionSampler
from specdec.grammar import GrammarCompiler
from specdec.params import Grammar, SamplingParams
from specdec.processors import RequestProcessor
from specdec.sampling import param_tensors, probs_from_logits

K = 2
N = 40_000
PASS, FAIL = 1e-3, 1e-12
MIN_ROWS = 40  # a prefix with fewer rows is left out of a conditional check

# One id per letter, <eos> last: a grammar over the 6-token vocabulary.
LETTERS = "abcde"
# Which letter may follow which: the mask at a position depends on the draft before it.
LARK = """
start: "a" ("b" | "c") ("a" | "d")
     | "b" ("d" | "e") ("b" | "c" | "e")
     | "c" ("a" | "b" | "d") "e"
     | "d" "a" "a"
     | "e" "c" ("a" | "b")
"""


def six_token_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(LETTERS)} | {"<eos>": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


CASES = {
    "top-k 3": (dict(top_k=3), NEAR),
    "top-p 0.8": (dict(top_p=0.8), NEAR),
    # Tokens 3 and 3 already generated: position 0 is penalised too.
    "penalties and bias": (
        dict(presence_penalty=1.0, frequency_penalty=0.8, logit_bias={2: 1.5, 4: -0.5}),
        NEAR,
    ),
    "penalties, t 0.7, top-k 4": (
        dict(temperature=0.7, top_k=4, presence_penalty=1.5, frequency_penalty=0.5),
        FAR,
    ),
    "grammar": (dict(grammar=Grammar("lark", LARK)), NEAR),
    "grammar and penalties": (
        dict(grammar=Grammar("lark", LARK), presence_penalty=2.0, logit_bias={1: 1.0}),
        FAR,
    ),
}
HISTORY = [3, 3]  # the committed output before the step


@pytest.fixture(scope="module")
def grammars():
    return GrammarCompiler(six_token_tokenizer(), V, frozenset({5}))


def table(params: SamplingParams, grammars, ignore_drafts: bool = False) -> torch.Tensor:
    """`[V, V, K+1, V]`: p at each position after drafts (d0, d1), through the engine's
    processor and transform (positions past a draft the grammar forbids: never used)."""
    processor = RequestProcessor(params, V, "cpu", grammars if params.grammar else None)
    if params.grammar is None:
        for t in HISTORY:
            processor.accept(t)
    out = torch.empty(V, V, K + 1, V)
    temps = param_tensors([params] * (K + 1))
    for d0, d1 in itertools.product(range(V), repeat=2):
        paths = [[], [], []] if ignore_drafts else [[], [d0], [d0, d1]]
        out[d0, d1] = probs_from_logits(processor(TARGET, paths), *temps)
    return out


def draft_q(params: SamplingParams, logits: torch.Tensor) -> torch.Tensor:
    """The draft's own q (unprocessed: any q keeps rejection sampling exact) [K, V]."""
    plain = SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    return probs_from_logits(logits, *param_tensors([plain] * K))


def run(acceptor, p_table, q, seed, n=N):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(q, n, replacement=True, generator=g).T.contiguous()  # [n, K]
    draft = Draft(tokens, q.expand(n, -1, -1), torch.full((n,), K))
    verdict = acceptor(draft, p_table[tokens[:, 0], tokens[:, 1]], [g] * n)
    return verdict, tokens


def conditional_pvalue(contexts: list[tuple], emitted: torch.Tensor, expected: dict) -> float:
    """Sum over contexts of the chi-square statistics of `emitted` against `expected[c]`
    (a [V] distribution); 0 if a token outside a context's support was emitted."""
    stat, dof = 0.0, 0
    rows: dict[tuple, list[int]] = {}
    for c, t in zip(contexts, emitted.tolist(), strict=True):
        rows.setdefault(c, []).append(t)
    for c, tokens in rows.items():
        p = expected[c].double().numpy()
        counts = np.bincount(tokens, minlength=V)
        if counts[p == 0].any():
            return 0.0
        if len(tokens) < MIN_ROWS:
            continue
        support = p > 0
        want = p[support] / p[support].sum() * len(tokens)
        stat += float(((counts[support] - want) ** 2 / want).sum())
        dof += int(support.sum()) - 1
    return float(chi2.sf(stat, dof)) if dof else float("nan")  # nan: nothing to test


def pvalues(verdict, tokens, p_table) -> list[float]:
    n, emitted = verdict.num_accepted, verdict.tokens
    values = [conditional_pvalue([()] * len(n), emitted[:, 0], {(): p_table[0, 0, 0]})]
    one = n >= 1
    d0 = tokens[one, 0].tolist()
    values.append(
        conditional_pvalue(
            [(a,) for a in d0], emitted[one, 1], {(a,): p_table[a, 0, 1] for a in range(V)}
        )
    )  # noqa: E501
    two = n >= 2
    pairs = [tuple(r) for r in tokens[two].tolist()]
    expected = {(a, b): p_table[a, b, 2] for a in range(V) for b in range(V)}
    values.append(conditional_pvalue(pairs, emitted[two, 2], expected))
    return values


def case(name, grammars, ignore_drafts=False):
    sampling, logits = CASES[name]
    params = SamplingParams(**sampling)
    return table(params, grammars, ignore_drafts), draft_q(params, logits)


PROCESSED = [n for n in CASES if "penalties" in n or "grammar" in n]  # top-k/p alone: see
# test_rejection_sampling.py


@pytest.mark.parametrize("name", PROCESSED)
def test_emitted_tokens_follow_the_processed_target(name, grammars):
    p_table, q = case(name, grammars)
    verdict, tokens = run(RejectionSampler(), p_table, q, seed=list(CASES).index(name))
    values = pvalues(verdict, tokens, p_table)
    print(name, [f"{v:.3g}" for v in values], "kept", verdict.num_accepted.float().mean())
    assert all(v > PASS for v in values), values  # nan (a position no row reached) fails
    # p really depends on the drafts before it (else the conditional checks test nothing)
    assert not torch.allclose(p_table[0, 0, 1], p_table[1, 0, 1])
    if "grammar" in name:  # drafts the grammar forbids are proposed, and never kept
        forbidden = p_table[0, 0, 0][tokens[:, 0]] == 0
        assert forbidden.any() and (verdict.num_accepted[forbidden] == 0).all()


@pytest.mark.parametrize("biased", [ResampleFromP, AcceptWithP])
@pytest.mark.parametrize("name", list(CASES))
def test_biased_acceptors_fail_on_filtered_cases(name, biased, grammars):
    p_table, q = case(name, grammars)
    verdict, tokens = run(biased(), p_table, q, seed=7, n=N // 4)
    values = pvalues(verdict, tokens, p_table)
    print(biased.__name__, name, [f"{v:.3g}" for v in values])
    assert min(v for v in values if v == v) < FAIL


@pytest.mark.parametrize("name", PROCESSED)
def test_a_processor_blind_to_the_drafts_fails(name, grammars):
    """Exact rejection sampling, but p at positions 1 and 2 processed as if the drafts
    before them were not there: the mistake the processor contract exists to prevent."""
    right, q = case(name, grammars)
    blind, _ = case(name, grammars, ignore_drafts=True)
    verdict, tokens = run(RejectionSampler(), blind, q, seed=11, n=N // 4)
    values = pvalues(verdict, tokens, right)
    print("blind", name, [f"{v:.3g}" for v in values])
    assert min(values[1:]) < FAIL
