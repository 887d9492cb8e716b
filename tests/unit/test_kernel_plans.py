"""Predicted kernel plans and the tuning budget (`kernel_plans`, `tuning_budget`): a machine
that has measured nothing runs at once on the plan predicted for its CPU, measures the
uncertain choices only while its budget lasts, and gives the same tokens either way."""

from __future__ import annotations

import json
import time

import pytest
import torch

from specdec import doctor, llm
from specdec.engine import Engine
from specdec.errors import InvalidParameterError
from specdec.kernels import decode_stack, kernel_plans, tuning, tuning_budget
from specdec.kernels.linear import BUCKETS, Linear
from specdec.kernels.quantize import quantize
from specdec.params import SamplingParams
from tests.tiny import hf_tiny, native_from_hf, tiny_tokenizer


def _int4():
    return quantize(native_from_hf(hf_tiny("qwen2")), "int4")


def _bf16():
    return native_from_hf(hf_tiny("qwen2")).to(torch.bfloat16)  # several candidates a group


@pytest.fixture
def native_on(monkeypatch):
    """The native build on (the suite turns it off elsewhere): int4 layers with one kernel,
    a decode stack to choose for. Skips where it cannot build."""
    from specdec.kernels import native

    monkeypatch.setenv("SPECDEC_NATIVE", "1")
    accessors = (native.bf16_gemv, native.q4_gemv, native.q4_tiles, native.decode_stack)
    for accessor in accessors:
        accessor.cache_clear()
    if native.decode_stack() is None:
        pytest.skip("no native build on this machine")
    yield native
    for accessor in accessors:
        accessor.cache_clear()


def _cache_in(monkeypatch, folder):
    """Kernel plans kept in `folder` (the native builds stay where they are: a fresh
    SPECDEC_HOME would build them again, minutes on two cores)."""
    monkeypatch.setattr(tuning, "kernel_cache", lambda: folder / "kernels.json")


def _no_timing(*args, **kwargs):
    pytest.fail("timed with no budget")


def test_every_class_predicts_every_bucket_and_a_kernel_each_layer_offers():
    layer = Linear(64, 48).to(torch.bfloat16)
    for isa, rules in kernel_plans.PREDICTED.items():
        assert set(rules["bfloat16"]) == set(BUCKETS), isa
        plan = kernel_plans.predicted_plan(layer, isa)
        assert set(plan) == set(BUCKETS) and set(plan.values()) <= set(layer.kernels())
    fp32 = Linear(64, 48)
    assert set(kernel_plans.predicted_plan(fp32).values()) <= set(fp32.kernels())


def test_a_zero_budget_predicts_everything_and_stores_it_as_predicted(
    tmp_path, monkeypatch, native_on
):
    _cache_in(monkeypatch, tmp_path)
    monkeypatch.setenv("SPECDEC_TUNE_BUDGET", "0")
    for name in ("measure_group", "measure_prefetch", "measure_layout", "measure_bf16_panels"):
        monkeypatch.setattr(tuning, name, _no_timing)
    monkeypatch.setattr(decode_stack, "_measure", _no_timing)
    model = llm._tuned(_int4())
    stored = json.loads(tuning.kernel_cache().read_text())
    entries = [*stored["groups"].values(), *stored.get("stacks", {}).values()]
    assert entries and all(entry["predicted"] for entry in entries)
    for module in model.modules():
        if isinstance(module, Linear):
            assert module.plan == kernel_plans.predicted_plan(module)
    taken = {b for b, way in model.decode_stack.measured.items() if way}
    assert taken == {b for b in decode_stack.STACK_BUCKETS if b <= 8}  # int4: up to 8 rows
    # doctor says which plans are in force and that they were predicted
    rows = doctor.kernel_rows(stored)
    assert rows and {row["source"] for row in rows} == {"predicted"}


def test_a_later_load_measures_what_was_predicted(tmp_path, monkeypatch):
    _cache_in(monkeypatch, tmp_path)
    monkeypatch.setenv("SPECDEC_TUNE_BUDGET", "0")
    llm._tuned(_bf16())
    monkeypatch.setenv("SPECDEC_TUNE_BUDGET", "60")
    assert tuning.pending_steps(_bf16()) == len(tuning._groups(_bf16())) > 1
    llm._tuned(_bf16())
    stored = json.loads(tuning.kernel_cache().read_text())
    assert not any(e.get("predicted") for e in stored["groups"].values())
    assert tuning.pending_steps(_bf16()) == 0


def test_a_measurement_starts_only_while_budget_is_left(tmp_path, monkeypatch):
    """Each uncertain group is a step; once the budget is spent the rest stay predicted."""
    monkeypatch.setenv("SPECDEC_TUNE_BUDGET", "0.05")
    model = _bf16()
    timed = []

    def slow(layers):
        timed.append(tuning.group_key(layers[0]))
        time.sleep(0.06)
        return tuning.predicted_group(layers) | {"predicted": False}

    monkeypatch.setattr(tuning, "measure_group", slow)
    entries = tuning.tune_kernels(model, cache=tmp_path / "k.json")
    assert len(timed) == 1 and len(entries) > 1
    assert [k for k, e in entries.items() if not e["predicted"]] == timed


def test_a_predicted_plan_gives_the_tokens_of_a_measured_one(tmp_path, monkeypatch, native_on):
    """The choices are exact alternatives: greedy tokens of an int4 and an fp32 tiny model
    are the same on the predicted plan and on the plan measured here."""
    tok = tiny_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=24)
    prompts = ["def fib(n):", "hello there", "a b c d e f"]
    for build in (_int4, lambda: native_from_hf(hf_tiny("qwen2"))):
        outputs = []
        for budget in ("0", "600"):
            _cache_in(monkeypatch, tmp_path / budget)
            monkeypatch.setenv("SPECDEC_TUNE_BUDGET", budget)
            tuning_budget.reset()
            model = llm._tuned(build())
            ids = [tok.encode(p) for p in prompts]
            done = Engine(model, tok, frozenset()).generate(ids, params)
            outputs.append([c.token_ids for c in done])
        stored = json.loads(tuning.kernel_cache().read_text())
        entries = [*stored["groups"].values(), *stored.get("stacks", {}).values()]
        assert not any(e.get("predicted") for e in entries)  # measured
        assert outputs[0] == outputs[1]


def test_a_bad_budget_is_a_precise_error(monkeypatch):
    monkeypatch.setenv("SPECDEC_TUNE_BUDGET", "soon")
    with pytest.raises(InvalidParameterError, match="SPECDEC_TUNE_BUDGET"):
        tuning_budget.budget_s()
    monkeypatch.setenv("SPECDEC_TUNE_BUDGET", "-1")
    with pytest.raises(InvalidParameterError, match=">= 0"):
        tuning_budget.allows()


def test_without_a_terminal_the_steps_are_one_status_line(monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_PROGRESS", "0")
    tuning_budget.plan_steps(3, "a model")
    with tuning_budget.measuring("x"):
        pass
    tuning_budget.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "timing up to 3 kernel choice(s) of a model" in err
