"""Greedy speculative decoding == plain greedy decoding, token for token, in fp32."""

import math

import pytest
import torch

from specdec.acceptors import Draft, GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter, NgramDrafter, draft_vocab
from specdec.drafters.draft_vocab import prune_vocab_head
from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 25


class OracleDrafter:
    """Proposes the true greedy continuation, except where `right(step, i)` says no."""

    def __init__(self, prompts, references, right):
        self.prompts, self.references, self.right = prompts, references, right
        self.histories, self.order, self.step = [], [], 0

    def admit(self, histories):
        for h in histories:
            self.order.append(next(i for i, p in enumerate(self.prompts) if h[: len(p)] == p))
            self.histories.append(list(h))

    def propose(self, k, params, generators):
        self.step += 1
        tokens = torch.zeros(len(self.histories), k, dtype=torch.long)
        for row, h in enumerate(self.histories):
            ref = self.references[self.order[row]]
            done = len(h) - len(self.prompts[self.order[row]])
            for i in range(k):
                true = ref[done + i] if done + i < len(ref) else 0
                tokens[row, i] = true if self.right(self.step, i) else (true + 1) % 97
        self._last = tokens
        return Draft(tokens, None, torch.full((len(self.histories),), k))

    def commit(self, num_accepted, next_tokens):
        for row, (n, nxt) in enumerate(
            zip(num_accepted.tolist(), next_tokens.tolist(), strict=True)
        ):
            self.histories[row] += self._last[row, :n].tolist() + [nxt]

    def move_row(self, src, dst):
        self.histories[dst], self.order[dst] = self.histories[src], self.order[src]
        self.reset_row(src)

    def reset_row(self, row):
        if row == len(self.histories) - 1:
            self.histories.pop()
            self.order.pop()


@pytest.fixture(scope="module")
def setup(tokenizer):
    native = native_from_hf(hf_tiny("qwen2"))
    plain = Engine(native, tokenizer, frozenset())
    params = SamplingParams(temperature=0, max_tokens=N)
    refs = [c.token_ids for c in plain.generate(PROMPTS, params)]
    return native, refs, params


def _spec(native, tokenizer, factory, k, acceptor=None, window=None, max_batch=8):
    return Engine(
        native,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        acceptor=acceptor or GreedyAcceptor(),
        window=window or FixedWindow(k),
    )


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
@pytest.mark.parametrize(
    "name,right,steps",
    [
        ("always right", lambda step, i: True, lambda k: math.ceil((N - 1) / (k + 1))),
        ("always wrong", lambda step, i: False, lambda k: N - 1),
        # right for the first two positions only: each step emits 3 tokens
        ("first two right", lambda step, i: i < 2, lambda k: math.ceil((N - 1) / 3)),
    ],
)
@pytest.mark.parametrize("k", [1, 4, 7])
def test_oracle_drafter_exact_output_and_passes(setup, tokenizer, acceptor, name, right, steps, k):
    native, refs, params = setup
    if name == "first two right" and k < 2:
        pytest.skip("needs k >= 2")
    factory = lambda b, length: OracleDrafter(PROMPTS, refs, right)  # noqa: E731
    out = _spec(native, tokenizer, factory, k, acceptor).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    assert all(c.stats.steps == steps(k) for c in out), [c.stats.steps for c in out]


def test_draft_model_drafter_greedy_equivalence(setup, tokenizer):
    native, refs, params = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
    for k in (1, 3, 6):
        out = _spec(native, tokenizer, factory, k).generate(PROMPTS, params)
        assert [c.token_ids for c in out] == refs


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
def test_pruned_draft_vocabulary_greedy_equivalence(setup, tokenizer, acceptor):
    """The target drafting for itself with its head cut to the even ids: a draft token is
    kept exactly where the reference token is even, and the output is unchanged."""
    native, refs, params = setup
    draft = native_from_hf(hf_tiny("qwen2"))  # the target's weights, its own head
    ids = torch.arange(0, 97, 2)
    prune_vocab_head(draft, ids)
    factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length, vocab=ids)  # noqa: E731
    out = _spec(native, tokenizer, factory, 3, acceptor).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    for c, ref in zip(out, refs, strict=True):
        done, kept = 1, 0  # the prefill emits the first token
        while done < N:
            window = ref[done : done + min(3, N - 1 - done)]
            run = next((i for i, t in enumerate(window) if t % 2), len(window))
            kept, done = kept + run, done + run + 1
        assert c.stats.accepted == kept
    assert sum(c.stats.accepted for c in out) > 0
    assert any(t % 2 for ref in refs for t in ref[1:])  # some drafts were really cut


def test_widened_draft_vocabulary_greedy_equivalence(setup, tokenizer):
    """The even-id cut widened by the row's context (`ContextIds`): a draft token is kept
    exactly where the reference token is even or already in the prompt or the output so
    far, and the output is unchanged. One prompt at a time: the context ids of a batch
    are those of all its rows."""
    native, refs, params = setup
    draft = native_from_hf(hf_tiny("qwen2"))
    ids = torch.arange(0, 97, 2)
    rows = draft_vocab.head_rows(draft.lm_head)
    prune_vocab_head(draft, ids)
    factory = lambda b, length: DraftModelDrafter(  # noqa: E731
        draft, 97, 97, b, length, vocab=ids, context_rows=rows
    )
    widened = 0
    for prompt, ref in zip(PROMPTS, refs, strict=True):
        out = _spec(native, tokenizer, factory, 3).generate([prompt], params)[0]
        assert out.token_ids == ref
        done, kept = 1, 0
        while done < N:
            seen = set(prompt) | set(ref[:done])
            window = ref[done : done + min(3, N - 1 - done)]
            run = next((i for i, t in enumerate(window) if t % 2 and t not in seen), len(window))
            widened += sum(t % 2 for t in window[:run])
            kept, done = kept + run, done + run + 1
        assert out.stats.accepted == kept
    assert widened > 0  # odd drafts were kept because the context held them


class CountingRejection(RejectionSampler):
    """The rejection sampler as a user's own acceptor: the engine hands it every pass."""

    calls = 0

    def __call__(self, draft, target_probs, generators):
        CountingRejection.calls += 1
        return super().__call__(draft, target_probs, generators)


def test_greedy_rows_skip_the_one_hot_distributions_and_keep_every_verdict(setup, tokenizer):
    """All-greedy passes with a built-in acceptor are judged on the logits' argmax; a user's
    acceptor still gets p. Same tokens and the same drafts kept, step for step."""
    native, refs, params = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
    fast = _spec(native, tokenizer, factory, 3, RejectionSampler()).generate(PROMPTS, params)
    CountingRejection.calls = 0
    user = _spec(native, tokenizer, factory, 3, CountingRejection()).generate(PROMPTS, params)
    assert [c.token_ids for c in fast] == [c.token_ids for c in user] == refs
    assert [c.stats.accepted for c in fast] == [c.stats.accepted for c in user]
    assert [c.stats.steps for c in fast] == [c.stats.steps for c in user]
    assert CountingRejection.calls >= max(c.stats.steps for c in user)  # one a batch pass
    assert 0 < sum(c.stats.accepted for c in fast) < sum(c.stats.drafted for c in fast)


def test_greedy_draft_is_the_draft_models_own_greedy_continuation(setup, tokenizer):
    """Greedy rows draft the argmax with no q (probs None: one-hot at the token)."""
    native, _, params = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    own = Engine(draft, tokenizer, frozenset())
    four = SamplingParams(temperature=0, max_tokens=4)
    expected = [c.token_ids for c in own.generate(PROMPTS[:2], four)]
    drafter = DraftModelDrafter(draft, 97, 97, 2, 64)
    drafter.admit(PROMPTS[:2])
    out = drafter.propose(4, [params, params], [None, None])
    assert out.probs is None
    assert out.tokens.tolist() == expected


def test_self_draft_accepts_everything(setup, tokenizer):
    """The target drafting for itself: every greedy draft token is accepted."""
    native, refs, params = setup
    factory = lambda b, length: DraftModelDrafter(native, 97, 97, b, length)  # noqa: E731
    out = _spec(native, tokenizer, factory, 4, RejectionSampler()).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    assert all(c.stats.acceptance_rate == 1.0 for c in out)
    assert all(c.stats.steps == math.ceil((N - 1) / 5) for c in out)


def test_ngram_drafter_greedy_equivalence(setup, tokenizer):
    native, refs, params = setup
    for k in (2, 5):
        out = _spec(native, tokenizer, lambda b, n: NgramDrafter(), k).generate(PROMPTS, params)
        assert [c.token_ids for c in out] == refs


def test_adaptive_window_greedy_equivalence(setup, tokenizer):
    native, refs, params = setup
    factory = lambda b, length: DraftModelDrafter(native, 97, 97, b, length)  # noqa: E731
    engine = _spec(native, tokenizer, factory, 0, window=AdaptiveWindow(k_max=6))
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs


def test_batched_equals_per_sequence_with_ragged_finishes(setup, tokenizer):
    native, _, _ = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
    engine = _spec(native, tokenizer, factory, 3)
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (30, 4, 17, 9)]
    batched = [c.token_ids for c in engine.generate(PROMPTS, params)]
    alone = [engine.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    assert batched == alone
    assert [len(t) for t in batched] == [30, 4, 17, 9]


def test_eos_inside_an_accepted_run_ends_the_row_there(setup, tokenizer):
    native, refs, params = setup
    eos = refs[0][6]
    factory = lambda b, length: OracleDrafter(PROMPTS, refs, lambda s, i: True)  # noqa: E731
    engine = Engine(
        native,
        tokenizer,
        frozenset({eos}),
        drafter_factory=factory,
        acceptor=GreedyAcceptor(),
        window=FixedWindow(8),
    )
    out = engine.generate(PROMPTS[:1], params)[0]
    assert out.token_ids == refs[0][: refs[0].index(eos) + 1]
    assert out.finish_reason == "stop"


def test_seeded_sampling_is_deterministic_with_speculation(setup, tokenizer):
    native, _, _ = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
    engine = _spec(native, tokenizer, factory, 4, RejectionSampler())
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=42, max_tokens=20)
    first = [c.token_ids for c in engine.generate(PROMPTS, params)]
    again = [c.token_ids for c in engine.generate(PROMPTS, params)]
    assert first == again


def test_padded_vocabularies_line_up(tokenizer):
    """Target and draft embedding tables padded past the tokenizer's 97 ids, differently."""
    target = native_from_hf(hf_tiny("qwen2", vocab_size=128))
    draft = native_from_hf(hf_tiny("qwen2", seed=2, vocab_size=112, num_hidden_layers=1))
    params = SamplingParams(temperature=0, max_tokens=N)
    refs = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(PROMPTS, params)]
    factory = lambda b, length: DraftModelDrafter(draft, 128, 97, b, length)  # noqa: E731
    out = _spec(target, tokenizer, factory, 4).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    drafted = factory(1, 64)
    drafted.admit([[5, 6, 7]])
    proposal = drafted.propose(3, [SamplingParams(temperature=1.0)], [torch.Generator()])
    assert proposal.probs.shape == (1, 3, 128)
    assert proposal.probs[..., 97:].sum() == 0 and (proposal.tokens < 97).all()


def test_a_row_that_opts_out_verifies_no_drafts_in_a_speculating_batch(setup, tokenizer):
    """Per-request `speculate=False` (the server's extension): that row's drafts are cut to
    nothing while its batch neighbours speculate; every row's output is unchanged."""
    from dataclasses import replace

    native, refs, params = setup
    factory = lambda b, length: DraftModelDrafter(native, 97, 97, b, length)  # noqa: E731
    off = replace(params, speculate=False)
    mixed = [off if i % 2 else params for i in range(len(PROMPTS))]
    out = _spec(native, tokenizer, factory, 4).generate(PROMPTS, mixed)
    assert [c.token_ids for c in out] == refs
    for i, c in enumerate(out):
        if i % 2:
            assert (c.stats.drafted, c.stats.steps) == (0, N - 1)
        else:
            assert c.stats.accepted == c.stats.drafted > 0
    # Nobody speculating: plain steps, the drafter asked for nothing.
    out = _spec(native, tokenizer, factory, 4).generate(PROMPTS, off)
    assert [c.token_ids for c in out] == refs and all(c.stats.drafted == 0 for c in out)


def test_the_trace_records_each_steps_tokens(setup, tokenizer):
    """LiveSequence.trace: (drafted, kept, emitted) per step, adding up to the output."""
    native, refs, params = setup
    factory = lambda b, length: OracleDrafter(PROMPTS, refs, lambda s, i: i < 2)  # noqa: E731
    engine = _spec(native, tokenizer, factory, 3)
    seqs = [engine.add_request(p, params) for p in PROMPTS]
    while any(not s.finished for s in seqs):
        engine.step()
    for s in seqs:
        assert 1 + sum(e for _, _, e in s.trace) == len(s.output_ids) == N
        assert all(k == min(2, d) for d, k, _ in s.trace)
        assert all(e == k + 1 for _, k, e in s.trace[:-1])
        assert sum(k for _, k, _ in s.trace) == s.stats.accepted


def test_draft_tokens_past_the_end_are_not_counted_as_kept(setup, tokenizer):
    """A row that ends (EOS) on an accepted draft token keeps only the drafts before it:
    usage's accepted tokens then match the tokens the client saw marked as drafts."""
    native, refs, params = setup
    ref = refs[0]
    end = next(i for i in range(6, N) if ref[i] not in ref[:i])  # its first occurrence
    factory = lambda b, length: OracleDrafter(PROMPTS, refs, lambda s, i: True)  # noqa: E731
    engine = Engine(
        native, tokenizer, frozenset({ref[end]}), drafter_factory=factory,
        acceptor=GreedyAcceptor(), window=FixedWindow(4),
    )  # fmt: skip
    [seq] = [engine.add_request(PROMPTS[0], params)]
    while not seq.finished:
        engine.step()
    assert seq.output_ids == ref[: end + 1] and seq.finish_reason == "stop"
    *_, (drafted, kept, emitted) = seq.trace
    at = (end - 1) % 5  # position of the EOS within its step (4 drafts + 1 of the target)
    assert (kept, emitted) == ((at + 1, at + 1) if at < 4 else (4, 5))
    assert seq.stats.accepted == sum(k for _, k, _ in seq.trace)
