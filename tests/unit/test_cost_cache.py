"""`auto`'s measured costs survive the process: saved per machine and set-up, read back."""

import json

import pytest
from window_steps import feed, pick

from specdec.llm import LLM
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, CostModel, WindowConfig, pricing
from specdec.window.cache import cost_file, load_acceptance, load_costs

from tiny import hf_tiny, tiny_tokenizer


def test_cost_model_round_trips_through_json():
    costs = CostModel()
    costs.observe_verify(1, 1, 0.010)
    costs.observe_verify(1, 1, 0.009)
    costs.observe_verify(2, 5, 0.030)
    costs.observe_draft(1, 4, 0.008)
    pricing.observe_prefill(costs, (40,), 0.2)
    pricing.observe_catch_up(costs, 40, 0.05)
    costs.draft_ratio = 0.3
    back = CostModel.from_json(json.loads(json.dumps(costs.to_json())))
    assert back == costs
    assert back.timed(1, 1) == 2 and back.verify_time(2, 5) == pytest.approx(0.030)


@pytest.fixture()
def tiny_dir(tmp_path):
    hf_tiny("qwen2").save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_a_fresh_llm_starts_from_the_last_ones_costs(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_COST_CACHE", "1")
    first = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="fp32")
    assert isinstance(first.engine.window, AdaptiveWindow)
    assert first.engine.window.costs == CostModel()  # nothing measured yet
    first.generate(["a b c a b c a b"], SamplingParams(temperature=0, max_tokens=24))
    measured = first.engine.window.costs
    assert measured.timed(1, 1) >= 1
    stored = list((tmp_path / "home" / "costs").glob("*.json"))
    assert len(stored) == 1 and load_costs(stored[0]) == measured

    second = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="fp32")
    assert second.engine.window.costs == measured  # warm: no steps spent re-measuring
    # Another set-up (here: another window limit is the same, another dtype is not).
    other = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="bf16")
    assert other.engine.window.costs == CostModel()


def test_the_cache_can_be_off_and_a_corrupt_file_is_ignored(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_COST_CACHE", "0")
    llm = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="fp32")
    llm.generate(["a b c a b c"], SamplingParams(temperature=0, max_tokens=8))
    assert not (tmp_path / "home" / "costs").exists()
    bad = cost_file({"x": 1})
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    assert load_costs(bad) is None


def test_a_fresh_llm_starts_from_the_last_ones_acceptance(tiny_dir, tmp_path, monkeypatch):
    """The window's acceptance is stored beside the costs, scaled to a weak prior, and a
    fresh LLM of the same set-up starts from it; a stored state that makes no sense is
    ignored (a cold start), never an error."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDEC_COST_CACHE", "1")
    first = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="fp32")
    first.generate(["a b c a b c a b c a b c"], SamplingParams(temperature=0, max_tokens=48))
    state = first.engine.window.acceptance_state()
    assert state["reached"] and 0 < state["reached"][0] <= WindowConfig().evidence
    (stored,) = (tmp_path / "home" / "costs").glob("*.json")
    assert load_acceptance(stored) == state

    second = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="fp32")
    assert second.engine.window.acceptance_state() == state

    data = json.loads(stored.read_text())
    stored.write_text(json.dumps(data | {"acceptance": {"reached": [1.0], "kept": [3.0]}}))
    third = LLM(str(tiny_dir), draft="ngram", speculate="auto", dtype="fp32")
    assert third.engine.window.acceptance_state() == {"reached": [], "kept": []}


def test_a_stored_draft_cost_far_over_its_price_is_looked_at_again():
    """A cache written on a busy host priced the int4 0.5B draft at 0.55 of the bf16
    1.5B's plain step (quiet: 0.15): no window paid, so no later process drafted, looked
    or re-timed it (`make demo` at 1.05x plain, 2.2x with the cache off). A stored draft
    cost counts as one timing: far over the plans' price it gets a look, and the look's
    faster timing replaces it."""
    busy = CostModel()
    for _ in range(3):
        busy.observe_verify(1, 1, 0.274)
    busy.observe_verify(1, 9, 0.300)
    for _ in range(3):
        busy.observe_draft(1, 4, 0.600, 0.150)
    data = json.loads(json.dumps(busy.to_json()))

    window = AdaptiveWindow()
    window.costs = CostModel.from_json(data)
    window.costs.draft_ratio = 0.08  # the bytes a draft step reads, against the target's
    window.start_from({"reached": [8.0, 6.0, 5.0], "kept": [6.0, 5.0, 4.0]})
    assert pick(window, 1) == 2  # a look, where the stored costs alone say plain
    feed(window, 1, 2, 0.145, 0.040, [1, 1], [1, 1], draft_first_s=0.020)
    assert window.costs.draft_seconds(1, 2) == pytest.approx(0.040)
    assert pick(window, 1) > 0

    # Stored at its price, the warm start is taken as it is: no look is forced.
    calm = CostModel()
    for _ in range(3):
        calm.observe_verify(1, 1, 0.130)
    calm.observe_draft(1, 1, 0.020, 0.020)
    loaded = CostModel.from_json(json.loads(json.dumps(calm.to_json())))
    loaded.draft_ratio = 0.08
    assert not loaded.look_unsettled(1)
