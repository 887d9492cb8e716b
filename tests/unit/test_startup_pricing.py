"""Pricing a cold start of speculation from the kernel plans' own timings.

Before a draft model's first step only the plain step and the prefill are timed. The
verify pass of k + 1 tokens and the draft step are then estimated: from the projections'
seconds per pass width that the kernel tuning stored (`projection_seconds`) when known,
else from the prefill line and the draft's weight ratio.
"""

import pytest
import torch

from specdec.models import kernel_tuning
from specdec.models.linear import BUCKETS, Linear


def _model():
    # Two groups: two 48x64 layers with bias, one 32x48 without.
    return torch.nn.Sequential(Linear(64, 48), Linear(64, 48), Linear(48, 32, bias=False))


def test_projection_seconds_sums_each_layers_planned_kernel(tmp_path):
    cache = tmp_path / "k.json"
    model = _model()
    chosen = kernel_tuning.tune_kernels(model, cache=cache)
    seconds = kernel_tuning.projection_seconds(model, cache=cache)
    assert set(seconds) == set(BUCKETS)
    for rows in BUCKETS:
        expected = sum(
            n * entry["seconds"][str(rows)][entry["plan"][str(rows)]]
            for n, entry in zip((2, 1), chosen.values(), strict=True)
        )
        assert seconds[rows] == pytest.approx(expected)


def test_projection_seconds_is_empty_without_plans_or_timings(tmp_path):
    cache = tmp_path / "k.json"
    assert kernel_tuning.projection_seconds(_model(), cache=cache) == {}  # never tuned
    assert kernel_tuning.projection_seconds(None, cache=cache) == {}  # no model (n-gram)
    model = _model()
    kernel_tuning.tune_kernels(model, cache=cache)
    model.append(Linear(32, 16))  # one projection without a plan: no partial price
    assert kernel_tuning.projection_seconds(model, cache=cache) == {}
    tuned = _model()
    kernel_tuning.tune_kernels(tuned, cache=cache)
    assert kernel_tuning.projection_seconds(tuned, cache=tmp_path / "other.json") == {}
