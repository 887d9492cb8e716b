"""The draft model's lazy prefill: admitted rows are only queued, steps with k = 0 cost the
draft nothing, and the first step with k > 0 catches each row up once. Greedy output stays
exactly plain decoding's (fp32) whenever the window switches between 0 and k > 0, and
the draft's cache always holds exactly the committed history it has been fed."""

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter
from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf

PROMPTS = [
    [5, 17, 42, 8],
    [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44],
    [33],
    [7, 7, 8, 7, 7, 8, 7],
    [9, 10],
    [21, 22, 23, 24, 25, 26],
]
LENGTHS = [20, 5, 13, 9, 16, 11]


@pytest.fixture(scope="module")
def setup(tokenizer):
    target = native_from_hf(hf_tiny("qwen2"))
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    plain = Engine(target, tokenizer, frozenset(), max_batch=1)
    refs = [plain.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    return target, params, refs


class ScriptedWindow(FixedWindow):
    """k from a script, one entry per step (cycled): switches speculation on and off."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(max(script))
        self.script, self.step = script, 0

    def choose(self, rows, catch_up=0, remaining=None) -> int:
        k = self.script[self.step % len(self.script)]
        self.step += 1
        return k


class Tracked(DraftModelDrafter):
    """Mirrors, per cache row, the tokens fed to the draft model (rolled back with the
    cache, moved with the rows), and logs every forward as (first_row, tokens per row)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fed: list[list[int]] = [[] for _ in range(self.max_batch)]
        self.calls: list[tuple[int, list[int]]] = []
        self.handle = self.model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs) -> None:
        tokens = args[0]
        if args[1] is not self._cache:  # a self-draft: the target's own passes
            return
        B, T = tokens.shape
        num_new = kwargs.get("num_new")
        num_new = [T] * B if num_new is None else num_new.tolist()
        first = kwargs.get("first_row", 0)
        self.calls.append((first, num_new))
        for b in range(B):
            self.fed[first + b] += tokens[b, : num_new[b]].tolist()

    def sync(self) -> None:
        """Drop what the cache rolled back (rejected drafts)."""
        for row, fed in enumerate(self.fed):
            del fed[self._cached(row) :]

    def move_row(self, src, dst) -> None:
        moved = self.fed[src]
        super().move_row(src, dst)  # resets src
        self.fed[dst] = moved

    def reset_row(self, row) -> None:
        super().reset_row(row)
        self.fed[row] = []


def _engine(target, tokenizer, draft, window, max_batch, acceptor=None):
    drafters = []

    def factory(rows, length):
        drafters.append(Tracked(draft, 97, 97, rows, length))
        return drafters[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        acceptor=acceptor or GreedyAcceptor(),
        window=window,
        max_len=64,
    )
    return engine, drafters


def _run_checked(engine, drafters, params, stagger=True):
    """Requests arrive one per step (each joins a batch mid-generation) or all at once.
    After every step each live row's draft cache + pending is its committed history."""
    seqs, waiting = [], list(zip(PROMPTS, params, strict=True))
    if not stagger:
        seqs = [engine.add_request(*w) for w in waiting]
        waiting = []
    while waiting or engine.has_work:
        if waiting:
            seqs.append(engine.add_request(*waiting.pop(0)))
        engine.step()
        drafter = drafters[-1]
        drafter.sync()
        for row, seq in enumerate(engine.live):
            history = seq.prompt_ids + seq.output_ids
            assert drafter.fed[row] + drafter.pending[row] == history, row
    return seqs


SCRIPTS = [[0], [3], [0, 0, 2], [2, 0, 0, 0], [0, 0, 0, 0, 0, 4, 1, 0], [1, 5, 0]]


@pytest.mark.parametrize("max_batch", [2, 8])
@pytest.mark.parametrize("script", SCRIPTS, ids=str)
@pytest.mark.parametrize("stagger", [True, False], ids=["staggered", "together"])
def test_switching_windows_match_plain_and_keep_the_history(
    setup, tokenizer, max_batch, script, stagger
):
    target, params, refs = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    engine, drafters = _engine(target, tokenizer, draft, ScriptedWindow(script), max_batch)
    seqs = _run_checked(engine, drafters, params, stagger)
    drafters[-1].handle.remove()
    assert [s.output_ids for s in seqs] == refs
    assert not engine.live and not engine.waiting


@pytest.mark.parametrize("max_batch", [2, 8])
def test_auto_matches_plain_with_a_lazy_draft(setup, tokenizer, max_batch):
    target, params, refs = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    window = AdaptiveWindow(k_max=5)
    engine, drafters = _engine(target, tokenizer, draft, window, max_batch, RejectionSampler())
    seqs = _run_checked(engine, drafters, params)
    drafters[-1].handle.remove()
    assert [s.output_ids for s in seqs] == refs


def test_self_draft_is_always_right_after_switching(setup, tokenizer):
    """The target drafting for itself keeps every draft only if its cache holds exactly
    the history: lazily caught-up rows included, whatever the window did before."""
    target, params, refs = setup
    window = ScriptedWindow([0, 0, 3, 0, 2, 2, 0])
    engine, drafters = _engine(target, tokenizer, target, window, 8)
    seqs = _run_checked(engine, drafters, params)
    drafters[-1].handle.remove()
    assert [s.output_ids for s in seqs] == refs
    for s in seqs:
        assert s.stats.accepted == s.stats.drafted > 0


def test_a_window_that_stays_at_zero_never_runs_the_draft(setup, tokenizer):
    """Nor allocates its cache: a draft that never drafts holds what plain decoding does."""
    target, params, refs = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    calls = []
    handle = draft.register_forward_pre_hook(lambda *a: calls.append(1))
    for max_batch in (2, 8):
        engine, drafters = _engine(target, tokenizer, draft, FixedWindow(0), max_batch)
        seqs = [engine.add_request(p, q) for p, q in zip(PROMPTS, params, strict=True)]
        while engine.has_work:
            engine.step()
            assert all(d._cache is None for d in drafters)
        assert [s.output_ids for s in seqs] == refs
    handle.remove()
    assert calls == []


def test_each_row_catches_up_once_at_its_first_speculative_step(setup, tokenizer):
    """Rows admitted while speculation is off are fed nothing until a step with k > 0,
    which feeds each row's whole pending history in one (ragged) catch-up pass; later
    steps feed one or two tokens per row, then one per draft token."""
    target, params, refs = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    window = ScriptedWindow([0, 0, 0, 3, 3, 0, 0, 2])
    engine, drafters = _engine(target, tokenizer, draft, window, 8)
    drafter = None
    seqs = [engine.add_request(p, q) for p, q in zip(PROMPTS, params, strict=True)]
    engine.admit()
    drafter = drafters[-1]
    for step in range(5):
        before = len(drafter.calls)
        histories = [len(s.prompt_ids + s.output_ids) for s in engine.live]
        engine.decode()
        new = drafter.calls[before:]
        if step < 3:
            assert new == []  # k = 0: nothing fed, history pending
        elif step == 3:
            first_row, fed = new[0]  # the catch-up: all but the last token of each row
            assert first_row == 0 and fed == [h - 1 for h in histories]
            assert [n for _, n in new[1:]] == [[1] * len(histories)] * 3
        else:  # caught up: one or two tokens per row, never the history again
            assert max(max(n) for _, n in new) <= 2 and len(new) == 3
    while engine.has_work:
        engine.step()
    drafter.handle.remove()
    assert [s.output_ids for s in seqs] == refs


def test_catch_up_pass_covers_only_the_rows_behind(setup, tokenizer):
    """A row admitted while the others speculate is caught up alone (its row slice), and
    every token of its history is fed exactly once."""
    target, params, refs = setup
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    engine, drafters = _engine(target, tokenizer, draft, FixedWindow(2), 8)
    seqs = [engine.add_request(PROMPTS[i], params[i]) for i in (0, 3)]
    engine.step()
    drafter = drafters[-1]
    drafter.sync()  # after every step: drop the rejected drafts
    engine.step()
    drafter.sync()
    seqs.append(engine.add_request(PROMPTS[1], params[1]))
    before = len(drafter.calls)
    engine.step()
    first_row, fed = drafter.calls[before]
    assert first_row == 2 and fed == [len(PROMPTS[1])]  # prompt + first token, less one
    drafter.sync()
    for row, seq in enumerate(engine.live):
        assert drafter.fed[row] + drafter.pending[row] == seq.prompt_ids + seq.output_ids
    while engine.has_work:
        engine.step()
    drafter.handle.remove()
    assert [s.output_ids for s in seqs] == [refs[0], refs[3], refs[1]]


def test_proposals_equal_an_eager_prefill(setup):
    """The lazy catch-up drafts what a draft prefilled at admission drafts (fp32)."""
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    histories = [PROMPTS[1] + [4], PROMPTS[2] + [6], PROMPTS[3] + [8]]
    lazy = DraftModelDrafter(draft, 97, 97, 3, 64)
    lazy.admit(histories)
    greedy = [SamplingParams(temperature=0)] * 3
    gens = [torch.Generator() for _ in range(3)]
    got = lazy.propose(4, greedy, gens).tokens
    expected = []
    for h in histories:  # each history alone, prefilled then drafted token by token
        cache = draft.new_cache(1, 64)
        tokens = list(h)
        logits = draft(torch.tensor([tokens]), cache).logits[:, -1]
        row = []
        for _ in range(4):
            row.append(int(logits[0, :97].argmax()))
            logits = draft(torch.tensor([[row[-1]]]), cache).logits[:, -1]
        expected.append(row)
    assert got.tolist() == expected
