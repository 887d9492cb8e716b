"""Drafts that cover only some rows (a prompt lookup that matches one row of four): how
wide the verify pass is, what the window learns from such a step, and which rows' gains
a batch job is judged by."""

from dataclasses import replace

import pytest

from specdec.acceptors import GreedyAcceptor
from specdec.drafters import NgramDrafter
from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow, controller
from specdec.window.acceptance import step_counts

PROMPTS = [[5, 17, 42, 8, 9], [4, 4, 31], [9, 8, 7, 6], [50, 12]]


class Oracle(NgramDrafter):
    """Proposes the target's own greedy continuation, for the `lucky` prompts only: an
    always-right drafter for those rows that proposes nothing for the others."""

    def __init__(self, outputs: dict[tuple, list[int]], lucky: set[tuple], most: int = 99):
        super().__init__()
        self.outputs, self.lucky, self.most = outputs, lucky, most

    def lookup(self, row: int, k: int) -> list[int]:
        history = self.histories[row]
        for prompt, out in self.outputs.items():
            if prompt in self.lucky and tuple(history[: len(prompt)]) == prompt:
                done = len(history) - len(prompt)  # tokens generated so far
                return out[done : done + min(k, self.most)]
        return []


class Recording(FixedWindow):
    """A fixed window that keeps what each step reports."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.steps: list[tuple] = []

    def observe(self, record) -> None:
        if record.prefilled:
            return
        reached, kept, judged, progress = step_counts(record)
        kw = {"judged": judged, "progress": progress if record.whole_batch else None}
        kw["width"] = record.width
        self.steps.append((record.rows, record.k, reached, kept, kw))


def _greedy_outputs(model, tokenizer, n: int) -> dict[tuple, list[int]]:
    plain = Engine(model, tokenizer, frozenset(), max_batch=4)
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    done = plain.generate(PROMPTS, params)
    return {tuple(p): c.token_ids for p, c in zip(PROMPTS, done, strict=True)}


def _engine(model, tokenizer, drafter, window, max_batch=4) -> Engine:
    return Engine(
        model,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda *_: drafter,
        acceptor=GreedyAcceptor(),
        window=window,
    )


def test_a_verify_pass_is_as_wide_as_its_longest_draft(hf_and_native, tokenizer, monkeypatch):
    """k = 4 asked, one row drafts 2 tokens, the rest nothing: the pass verifies 3
    positions per row, not 5; with no row drafting it is a plain step. Output unchanged."""
    model = hf_and_native[1]
    outputs = _greedy_outputs(model, tokenizer, 12)
    widths = []
    forward = model.forward

    def counting(tokens, *args, **kwargs):
        widths.append(tokens.shape[1])
        return forward(tokens, *args, **kwargs)

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for lucky, expected in (({tuple(PROMPTS[1])}, 3), (set(), 1)):
        window = Recording(4)
        engine = _engine(model, tokenizer, Oracle(outputs, lucky, most=2), window)
        widths.clear()
        with monkeypatch.context() as patch:
            patch.setattr(model, "forward", counting)
            got = [c.token_ids for c in engine.generate(PROMPTS, params)]
        assert got == [outputs[tuple(p)] for p in PROMPTS]
        assert widths[1:3] == [expected, expected]  # after the prefill: two steps
        assert window.steps[0][4]["width"] == expected


def test_a_row_without_a_draft_counts_as_a_rejection(hf_and_native, tokenizer):
    """One row in four drafts (and is always right): position 0 was tested by every row
    the window asked and kept by one, so a 4-row pass is priced at a quarter of the
    lucky row's acceptance, which is what the batch gains from it."""
    model = hf_and_native[1]
    outputs = _greedy_outputs(model, tokenizer, 12)
    window = Recording(2)
    engine = _engine(model, tokenizer, Oracle(outputs, {tuple(PROMPTS[0])}), window)
    engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for p in PROMPTS[1:]:
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    engine.step()  # the server's loop: every row judged
    rows, k, drafted_at, accepted_at, kw = window.steps[0]
    assert (rows, k) == (4, 2)
    assert drafted_at == [4, 1] and accepted_at == [1, 1]
    assert kw["judged"] == 4


def test_a_batch_job_is_judged_by_its_longest_rows(hf_and_native, tokenizer):
    """Inside `generate`, with nothing waiting, the batch counts as one row, as far as
    the rows with the most tokens left all went: the caller waits for them. While
    requests wait, or through `step` (a server), every row counts."""
    model = hf_and_native[1]
    outputs = _greedy_outputs(model, tokenizer, 12)
    lengths = [12, 6, 12, 6]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]

    window = Recording(2)
    _engine(model, tokenizer, Oracle(outputs, set()), window).generate(PROMPTS, params)
    assert window.steps[0][4]["judged"] == 1  # the batch: rows 0 and 2 have the most left
    assert window.steps[0][2:4] == ([1, 0], [0, 0])  # it tested a first draft, kept none

    window = Recording(2)
    engine = _engine(model, tokenizer, Oracle(outputs, set()), window, max_batch=2)
    engine.generate(PROMPTS, params)  # two rows at a time: requests wait at first
    assert window.steps[0][4]["judged"] == 2

    window = Recording(2)
    engine = _engine(model, tokenizer, Oracle(outputs, set()), window)
    for p, q in zip(PROMPTS, params, strict=True):
        engine.add_request(p, q)
    engine.step()
    assert window.steps[0][4]["judged"] == 4


class SimulatedHost(AdaptiveWindow):
    """`auto` on a host where a pass of T tokens per row costs 1 + 0.15 (T - 1) plain
    steps whatever the rows (memory-bound) and drafting is free (a prompt lookup): the
    engine's real timings are replaced, so what it chooses is deterministic."""

    seconds = 0.0

    def observe(self, record) -> None:
        if not record.prefilled:
            verify_s = 1.0 + 0.15 * (record.width - 1)
            self.seconds += verify_s
            record = replace(record, verify_s=verify_s, draft_s=0.0)
        super().observe(record)


def test_auto_never_slows_a_batch_whose_longest_rows_get_no_drafts(
    hf_and_native, tokenizer, monkeypatch
):
    """Four equal requests, one of which the drafter always gets right and the others
    never: the batch ends with the three unlucky rows, so no window shortens it and every
    draft step only costs. Judged by every row (a 4-row pass at a quarter of one row's
    acceptance, which pays on a mean), `auto` kept drafting and the batch took longer than
    plain decoding; judged by its longest rows, it gives up within a few steps. The guard
    alone, crediting how far each step took the batch (`StepRecord.whole_batch`), also stops
    it, later."""
    model = hf_and_native[1]
    n = 48
    outputs = _greedy_outputs(model, tokenizer, n)
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    def run() -> float:
        window = SimulatedHost()
        engine = _engine(model, tokenizer, Oracle(outputs, {tuple(PROMPTS[0])}), window)
        got = [c.token_ids for c in engine.generate(PROMPTS, params)]
        assert got == [outputs[tuple(p)] for p in PROMPTS]
        return window.seconds

    plain_s = n - 1.0  # one plain step per token after the prefill's
    assert plain_s / run() >= 0.97

    def every_row(record):  # counts over every row; the guard credits the batch's progress
        reached, kept, judged, _ = step_counts(replace(record, whole_batch=False))
        return reached, kept, judged, step_counts(record)[3]

    monkeypatch.setattr(controller, "step_counts", every_row)
    assert plain_s / run() >= 0.97  # the guard, crediting how far the batch went, holds it
    alone = lambda record: step_counts(replace(record, whole_batch=False))  # noqa: E731
    monkeypatch.setattr(controller, "step_counts", alone)
    assert plain_s / run() < 0.95, "the checks above must fail when every row is judged"


@pytest.mark.parametrize("lucky", [0, 4])
def test_n_gram_counts_keep_the_output(hf_and_native, tokenizer, lucky):
    """However many rows draft, greedy output is the target's own."""
    model = hf_and_native[1]
    outputs = _greedy_outputs(model, tokenizer, 16)
    chosen = {tuple(p) for p in PROMPTS[:lucky]}
    engine = _engine(model, tokenizer, Oracle(outputs, chosen), AdaptiveWindow(k_max=4))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = [c.token_ids for c in engine.generate(PROMPTS, params)]
    assert got == [outputs[tuple(p)] for p in PROMPTS]


def test_a_batch_job_advances_as_far_as_its_longest_rows_all_go(hf_and_native, tokenizer):
    """Four rows tied at the most tokens left, one of which keeps its two drafts: their
    mean reads 1.5 tokens a step, but the batch, which ends with its longest row, went
    one token (what the guard credits, `progress`, and what the window's acceptance
    counts). Through `step` (a server: every row on its own) there is no such batch,
    and no `progress`."""
    model = hf_and_native[1]
    outputs = _greedy_outputs(model, tokenizer, 12)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    window = Recording(2)
    _engine(model, tokenizer, Oracle(outputs, {tuple(PROMPTS[0])}), window).generate(
        PROMPTS, params
    )
    rows, k, drafted_at, accepted_at, kw = window.steps[0]
    assert kw["progress"] == 1.0 and kw["judged"] == 1  # the batch, counted as one row
    assert drafted_at == [1, 0] and accepted_at == [0, 0]  # its first draft: rejected
    # Row 0 is now two ahead: the three others are the batch's longest rows.
    assert window.steps[1][4]["progress"] == 1.0

    lucky = {tuple(p) for p in PROMPTS}  # every row keeps both drafts: three tokens
    window = Recording(2)
    _engine(model, tokenizer, Oracle(outputs, lucky), window).generate(PROMPTS, params)
    assert window.steps[0][4]["progress"] == 3.0
    assert window.steps[0][2:4] == ([1, 1], [1, 1])

    window = Recording(2)
    engine = _engine(model, tokenizer, Oracle(outputs, {tuple(PROMPTS[0])}), window)
    for p in PROMPTS:
        engine.add_request(p, params)
    engine.step()
    assert window.steps[0][4]["progress"] is None
