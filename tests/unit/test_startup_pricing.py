"""Pricing a cold start of speculation from the kernel plans' own timings.

Before a draft model's first step only the plain step and the prefill are timed. The
verify pass of k + 1 tokens and the draft step are then estimated: from the projections'
seconds per pass width that the kernel tuning stored (`projection_seconds`) when known,
else from the prefill line and the draft's weight ratio.
"""

import pytest
import torch

from specdec.drafters import DraftModelDrafter
from specdec.engine import Engine
from specdec.kernels import tuning
from specdec.kernels.linear import BUCKETS, Linear
from specdec.kernels.quantize import quantize
from specdec.models.footprint import step_bytes
from specdec.params import SamplingParams
from specdec.types import Batch
from specdec.window import (
    AdaptiveWindow,
    CostModel,
    WindowConfig,
    pricing,
    startup_pays,
)

from tiny import hf_tiny, native_from_hf

FIRST_TIMINGS = WindowConfig().first_timings
BLIND = 2 * WindowConfig().explore_share  # the gain a start needs before any draft is seen


def _model():
    # Two groups: two 48x64 layers with bias, one 32x48 without.
    return torch.nn.Sequential(Linear(64, 48), Linear(64, 48), Linear(48, 32, bias=False))


def test_projection_seconds_sums_each_layers_planned_kernel(tmp_path):
    cache = tmp_path / "k.json"
    model = _model()
    chosen = tuning.tune_kernels(model, cache=cache)
    seconds = tuning.projection_seconds(model, cache=cache)
    assert set(seconds) == set(BUCKETS)
    for rows in BUCKETS:
        expected = sum(
            n * entry["seconds"][str(rows)][entry["plan"][str(rows)]]
            for n, entry in zip((2, 1), chosen.values(), strict=True)
        )
        assert seconds[rows] == pytest.approx(expected)


def test_projection_seconds_is_empty_without_plans_or_timings(tmp_path):
    cache = tmp_path / "k.json"
    assert tuning.projection_seconds(_model(), cache=cache) == {}  # never tuned
    assert tuning.projection_seconds(None, cache=cache) == {}  # no model (n-gram)
    model = _model()
    tuning.tune_kernels(model, cache=cache)
    model.append(Linear(32, 16))  # one projection without a plan: no partial price
    assert tuning.projection_seconds(model, cache=cache) == {}
    tuned = _model()
    tuning.tune_kernels(tuned, cache=cache)
    assert tuning.projection_seconds(tuned, cache=tmp_path / "other.json") == {}


# The measured case: the 1.5B target (plain step 0.19 s, a 47-token prefill 1.7 s) and
# its 0.5B int4 draft (0.27 of it by weights), a 64-token answer. `--speculate 4` ran
# 6.7 tok/s against 4.0 plain; a verify pass of 5 tokens took 0.24 s.
PLAIN, PREFILL, PROMPT, RATIO, LEFT = 0.19, 1.7, 47, 0.27, 61
START = Batch(1, LEFT, PROMPT)
# Projection seconds per pass width as a plan might store them: 5 rows cost 1.3x one.
TARGET_PLAN = {1: 1.0, 2: 1.05, 4: 1.2, 8: 1.6, 16: 2.4, 32: 4.5, 64: 8.8, 256: 34.0}


def _cold(target_plan=None, draft_plan=None):
    costs = CostModel()
    for _ in range(FIRST_TIMINGS):
        costs.observe_verify(1, 1, PLAIN)
    pricing.observe_prefill(costs, (PROMPT,), PREFILL)
    costs.draft_ratio = RATIO
    costs.target_plan_s, costs.draft_plan_s = target_plan or {}, draft_plan or {}
    return costs


def test_the_verify_pass_grows_as_the_plans_projections_do():
    costs = _cold(TARGET_PLAN)
    assert pricing.startup_verify_time(costs, 1, 5) == pytest.approx(PLAIN * 1.3)
    assert pricing.startup_verify_time(costs, 1, 2) == pytest.approx(PLAIN * 1.05)
    assert pricing.startup_verify_time(costs, 1, 1) == pytest.approx(PLAIN)
    # Without plans: the line from the plain step to the prefill, steep on a CPU.
    line = PLAIN + (PREFILL - PLAIN) * 4 / (PROMPT - 1)
    assert pricing.startup_verify_time(_cold(), 1, 5) == pytest.approx(line)
    assert line > 0.3
    # Once two widths are timed, the measurements decide.
    costs.observe_verify(1, 5, 0.5)
    assert pricing.startup_verify_time(costs, 1, 5) == pytest.approx(0.5)


def test_the_draft_prior_comes_from_both_plans_or_the_weight_ratio():
    draft_plan = {rows: 0.35 * s for rows, s in TARGET_PLAN.items()}
    assert _cold(TARGET_PLAN, draft_plan).draft_share(1) == pytest.approx(0.35)
    cold = _cold(TARGET_PLAN, draft_plan)
    assert pricing.catch_up_time(cold, PROMPT) == pytest.approx(0.35 * PREFILL)
    assert _cold(TARGET_PLAN).draft_share(1) == RATIO  # the draft has no plan
    assert _cold(draft_plan=draft_plan).draft_share(1) == RATIO  # the target has none
    no_ratio = _cold()
    no_ratio.draft_ratio = None
    assert no_ratio.draft_share(1) == 1.0
    # A measured draft step replaces the prior.
    costs = _cold(TARGET_PLAN, draft_plan)
    costs.observe_draft(1, 1, 0.1)
    assert costs.draft_time(1) == pytest.approx(0.1)


def test_a_cold_start_pays_where_the_plans_say_verifying_is_cheap():
    """The measured case: priced from the prefill line, the start-up's predicted net gain
    is 18% of the plain decoding ahead, under the 20% bar (`STARTUP_MIN_GAIN`): the draft
    never started. Priced from the plans it is 24%, and it starts."""
    alpha = AdaptiveWindow().acceptance.prior()
    draft_plan = {rows: 0.3 * s for rows, s in TARGET_PLAN.items()}
    assert not startup_pays(_cold(), START, alpha, 8, BLIND)
    assert startup_pays(_cold(TARGET_PLAN, draft_plan), START, alpha, 8, BLIND)
    # A plan where five rows cost what the prefill line says still does not start.
    steep = {rows: 1.0 + 0.033 * (rows - 1) for rows in BUCKETS}
    assert not startup_pays(_cold(steep, draft_plan), START, alpha, 8, BLIND)


def _tiny_pair_engine(tokenizer, window):
    """(engine, target, draft): a tiny Qwen2 target with a one-layer draft model."""
    target = native_from_hf(hf_tiny("qwen2"))
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        drafter_factory=lambda rows, length: DraftModelDrafter(draft, 97, 97, rows, length),
        window=window,
    )
    return engine, target, draft


def test_the_engine_hands_the_plans_to_the_window(tokenizer, monkeypatch):
    """The engine gives the window both models' projection seconds when it builds the
    drafter (empty for a model without plans, as these tiny ones are: the fallbacks)."""
    window = AdaptiveWindow(k_max=4)
    engine, target, draft = _tiny_pair_engine(tokenizer, window)
    engine.generate([[5, 17, 42, 8]], SamplingParams(temperature=0, max_tokens=3))
    assert (window.costs.target_plan_s, window.costs.draft_plan_s) == ({}, {})
    assert window.costs.draft_ratio == pytest.approx(step_bytes(draft) / step_bytes(target))
    monkeypatch.setattr(tuning, "projection_seconds", lambda m: {1: float(id(m))})
    engine._cache = None  # rebuilt (with the drafter) at the next request
    engine.generate([[5, 17, 42, 8]], SamplingParams(temperature=0, max_tokens=3))
    plans = (window.costs.target_plan_s, window.costs.draft_plan_s)
    assert plans == ({1: float(id(target))}, {1: float(id(draft))})


def test_step_bytes_count_what_a_step_reads():
    """An int4 draft reads under a third of its bf16 bytes; the parameter count missed it."""
    shape = dict(hidden_size=256, intermediate_size=512)  # whole super-blocks of 256
    target = native_from_hf(hf_tiny("qwen2", **shape), torch.bfloat16)
    draft = native_from_hf(hf_tiny("qwen2", num_hidden_layers=1, **shape), torch.bfloat16)
    dense = step_bytes(draft) / step_bytes(target)
    assert dense == pytest.approx(0.5, rel=0.02)  # one of two equal layers
    assert step_bytes(quantize(draft, "int4")) / step_bytes(target) < 0.35 * dense
    assert step_bytes(None) is None  # a drafter that is not a model: priced by its timings


def test_a_steps_first_draft_token_is_priced_apart():
    """An int4-like pair: the first draft pass of a step feeds two tokens per row after a
    fully accepted step and costs 1.3 of the later ones. Timed apart, k = 2 costs one first
    pass and one later step, and `best_window` prefers it to k = 1 (as measured on the
    int4 pair: 1.22x against 1.11x); averaged per token as before, every window looked
    dearer by the same share and k = 1 and k = 2 came out level."""
    plain, step, first = 1.0, 0.39, 0.507
    verify = {0: plain, 1: 1.15, 2: 1.4, 3: 1.75}
    alpha = [0.95] * 3

    def observed(split: bool) -> CostModel:
        costs = CostModel.measured(1, verify, step)
        costs.draft_step_s = {}
        for _ in range(10):  # k = 1 steps, then one probe at k = 3
            costs.observe_draft(1, 1, first, first if split else None)
        costs.observe_draft(1, 3, first + 2 * step, first if split else None)
        return costs

    split = observed(True)
    assert split.draft_time(1) == pytest.approx(step) and split.draft_first_s == {1: first}
    assert split.draft_seconds(1, 2) == pytest.approx(first + step)
    assert split.best_window(1, alpha, 3)[0] == 2
    averaged = observed(False)
    assert averaged.draft_seconds(1, 2) > first + step + 0.08
    assert abs(averaged.predict(1, alpha, 2) / averaged.predict(1, alpha, 1) - 1) < 0.02
    # Before a later step is timed, the first stands in for it.
    only_first = CostModel.measured(1, verify, step)
    only_first.draft_step_s = {}
    only_first.observe_draft(1, 1, first, first)
    assert only_first.draft_time(1) == first and only_first.draft_seconds(1, 3) == 3 * first
    assert CostModel.from_json(split.to_json()) == split


def test_the_draft_model_times_its_first_draft_token(tokenizer):
    """The engine hands `auto` the draft model's first-token seconds of each step."""
    seen = []

    class Recording(AdaptiveWindow):
        def choose(self, batch):
            return 3

        def observe(self, record):
            if not record.prefilled:
                seen.append((record.k, record.draft_s, record.first_s))

    engine, _, _ = _tiny_pair_engine(tokenizer, Recording(k_max=3))
    engine.generate([[5, 17, 42, 8]], SamplingParams(temperature=0, max_tokens=9))
    drafted = [(total, first) for k, total, first in seen if k == 3]
    assert drafted and all(0 < first < total for total, first in drafted)
    assert all(first is None for k, _, first in seen if k == 0)


def test_a_catch_up_is_priced_by_its_width_not_by_the_average_token():
    """A catch-up pass costs a fixed part plus a part per token: the int4 0.5B draft on a
    Zen 4 took 25 ms for 2 tokens and 131 ms for 47. The per-token average of short
    catch-ups priced a new prompt's at 2-3x its cost, which refused starts that paid."""
    costs, per_token = CostModel(), None
    for tokens, seconds in [(2, 0.025), (3, 0.030), (16, 0.069), (47, 0.131)]:
        pricing.observe_catch_up(costs, tokens, seconds)
        per_token = (
            seconds / tokens if per_token is None else 0.8 * per_token + 0.2 * seconds / tokens
        )
    assert pricing.catch_up_time(costs, 46) == pytest.approx(0.131, rel=0.1)
    assert per_token * 46 > 2 * pricing.catch_up_time(costs, 46)  # the old running average's price
    single = CostModel()
    pricing.observe_catch_up(single, 40, 0.1)  # one width: its seconds per token
    assert pricing.catch_up_time(single, 80) == pytest.approx(0.2)
    noisy = CostModel()
    pricing.observe_catch_up(noisy, 10, 0.05)
    pricing.observe_catch_up(noisy, 11, 0.04)  # falls with width: noise, priced per token
    assert pricing.catch_up_time(noisy, 21) == pytest.approx(0.09)
