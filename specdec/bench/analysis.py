"""Figures derived from the measured rows: speedups, predictions, cost per token.

Recomputed from scratch every time results are saved, so a resumed run, a new price or a
fix here never leaves stale numbers behind.

Two speedups over plain decoding of the same group:
- `speedup`: end-to-end tokens/s (prefill included), what a user waiting for the batch
  sees: the median run's over plain's median run.
- `paired_speedup`: the same, as the median over turns of each run's tokens/s over plain's
  run in the same turn, where the group's methods took turns (`Runner.measure_group`,
  2+ runs each). Drift on a shared CPU cancels within a turn, so
  "auto >= 0.97x plain" is checked on it where it exists, on `speedup` otherwise.
- `paired_decode_speedup`: the decode phase's per-turn median, as `paired_speedup`. At a
  long prompt the prefill is most of a run and the same work for every method, yet its
  wall time varies between runs on a shared CPU by more than `auto` gains or loses in the
  decode; this ratio leaves it out.
- `decode_speedup`: decode phase only (wall time less prefill). The cost model predicts
  this one (it prices target and draft steps, not the prefill), so predicted vs measured
  compares like with like. The draft's prefill is lazy (a catch-up pass at the first
  step that speculates), so it is timed in the decode phase, not in `prefill_s`.
- `request_speedup` (`_low`, `_high`): every request's tokens/s over plain's for the same
  prompt in the same turn, as a geometric mean with its 95% interval (t on the log
  ratios): a floor judged by an interval over many pairs, not one run's point.
- `cpu_speedup`: end to end in this process's CPU seconds; on a shared machine with
  `--threads 1` it is what wall time would show on a quiet one.
- `paired_cpu_speedup`: the same per turn, as `paired_speedup` (at 1024 x 4 the
  median runs, taken from different turns, read 0.91x where the wall-time turns spread
  0.88-1.12x).

Predictions come from `specdec.window` with costs measured at the point's batch size
and context (`costs.py`) and the acceptance per position the point measured, where the
point's verify curve has two or more widths (none with `--curve-ks 0`):
- fixed k: `predict_speedup(costs, B, alpha, k)`.
- `auto`: what `AdaptiveWindow` would choose from the same inputs, `best_window` with its
  margin (1.0 and k = 0 when speculation is not predicted to pay).
- `predicted_from_tokens_per_pass`: the measured tokens per target pass over the measured
  step cost, isolating the cost half of the model from the acceptance half.
"""

from __future__ import annotations

import math
import statistics

from specdec.bench.costs import cost_model
from specdec.window import WindowConfig, conditional_acceptance, predict_speedup

AUTO_MARGIN = WindowConfig().margin


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index where two outputs first differ; None when identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def derive(rows: list[dict], costs: dict, k_max: int, price_per_hour: float | None) -> None:
    """Fill the derived fields of the "ok" rows in place."""
    ok = [r for r in rows if r.get("status") == "ok"]
    plain = {r["group"]: r for r in ok if r["method"] == "plain"}
    for row in ok:
        base = plain.get(row["group"])
        row["speedup"] = _ratio(row["tokens_per_s"], base and base["tokens_per_s"])
        row["paired_speedup"] = _paired(row, base)
        row["paired_decode_speedup"] = _paired(row, base, "runs_decode_tokens_per_s")
        row["decode_speedup"] = _ratio(
            row.get("decode_tokens_per_s"), base and base.get("decode_tokens_per_s")
        )
        row["cpu_speedup"] = _ratio(
            row.get("cpu_tokens_per_s"), base and base.get("cpu_tokens_per_s")
        )
        row["paired_cpu_speedup"] = _paired(row, base, "runs_cpu_tokens_per_s")
        interval = _requests_paired(row, base)
        row["request_speedup"], row["request_speedup_low"], row["request_speedup_high"] = interval
        row["cost_per_million_tokens"] = (
            round(price_per_hour / 3600 / row["tokens_per_s"] * 1e6, 4)
            if price_per_hour and row["tokens_per_s"] > 0
            else None
        )
        _compare_outputs(row, base)
        _predict(row, costs.get(row.get("cost_key", "")), k_max)


def _ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 4) if x and y else None


def _same_turns(row: dict, base: dict | None) -> bool:
    """Whether `row` and plain's `base` took the same turns (their runs pair one to one)."""
    return base is not None and row.get("turns") is not None and row["turns"] == base.get("turns")


def _paired(row: dict, base: dict | None, field: str = "runs_tokens_per_s") -> float | None:
    """Median over turns of the run's tokens/s (`field`: each run's, in run order) over
    plain's in the same turn; None unless both rows took the same turns with 2+ runs each."""
    if not _same_turns(row, base):
        return None
    runs, plain = row.get(field) or [], base.get(field) or []
    if len(runs) != len(plain) or len(runs) < 2 or None in runs or None in plain:
        return None
    return round(statistics.median(r / p for r, p in zip(runs, plain, strict=True)), 4)


def _requests_paired(row: dict, base: dict | None) -> tuple[float | None, ...]:
    """(geometric mean, 95% low, 95% high) of every request's tokens/s over plain's for the
    same prompt in the same turn; Nones with fewer than 6 pairs (`_t95`'s range)."""
    none = (None, None, None)
    if not _same_turns(row, base):
        return none
    runs, plain = row.get("runs_request_tokens_per_s"), base.get("runs_request_tokens_per_s")
    if not runs or not plain or len(runs) != len(plain):
        return none
    ratios = [
        r / p
        for run, plain_run in zip(runs, plain, strict=True)
        for r, p in zip(run, plain_run, strict=False)
        if r and p
    ]
    if len(ratios) < 6:
        return none
    return tuple(round(x, 4) for x in ratio_interval(ratios))


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """(geometric mean, 95% low, 95% high) of paired ratios (at least 2; `_t95` is within
    1% of the table from 6), from a t interval on their logs."""
    logs = [math.log(r) for r in ratios]
    mean, n = statistics.fmean(logs), len(logs)
    half = _t95(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _t95(df: int) -> float:
    """Student's t two-sided 95% quantile (Cornish-Fisher from the normal's: within 1% of
    the table from 5 degrees of freedom, too narrow below)."""
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _compare_outputs(row: dict, base: dict | None) -> None:
    """Greedy only: the fraction of requests whose output equals plain decoding's, and
    where each first departs (bf16 kernels of other shapes can flip near-ties)."""
    row["same_output_as_plain"] = row["first_divergence"] = None
    if row["temperature"] != 0 or base is None or "token_ids" not in row:
        return
    pairs = list(zip(row["token_ids"], base.get("token_ids") or [], strict=False))
    if not pairs:
        return
    row["first_divergence"] = [first_difference(a, b) for a, b in pairs]
    row["same_output_as_plain"] = round(
        sum(d is None for d in row["first_divergence"]) / len(pairs), 4
    )


def _predict(row: dict, entry: dict | None, k_max: int) -> None:
    row["predicted_speedup"] = row["predicted_best_k"] = None
    row["predicted_from_tokens_per_pass"] = None
    window = row.get("window")
    per_position = row.get("acceptance_per_position")
    # A tree step is not a chain of its depth: the model prices chains only. A curve of
    # one point (`--curve-ks 0`) has no shape to price a window with: it would read as
    # flat, every pass as cheap as a plain step, and predict far more than runs.
    if entry is None or window in (None, "tree") or per_position is None:
        return
    if len(entry["verify_s"]) < 2:
        return
    costs = cost_model(entry, drafter=row["method"].split("-")[0])
    if costs is None:  # heads measured before their cost was
        return
    rows = row["batch"]
    alpha = conditional_acceptance(per_position)
    if window == "auto":
        k, speedup = costs.best_window(rows, alpha, k_max)
        if speedup <= 1 + AUTO_MARGIN:
            k, speedup = 0, 1.0
        row["predicted_best_k"] = k
    else:
        k, speedup = window, predict_speedup(costs, rows, alpha, window)
        step = costs.draft_seconds(rows, k) + costs.verify_time(rows, k + 1)
        tokens_per_pass = row["mean_accepted_length"]
        row["predicted_from_tokens_per_pass"] = round(
            tokens_per_pass * costs.verify_time(rows, 1) / step, 4
        )
    row["predicted_speedup"] = None if speedup is None else round(speedup, 4)


def best_k_by_group(rows: list[dict], costs: dict, k_max: int) -> dict[str, dict]:
    """Per group: the best fixed k measured, and the best k and speedup the cost model
    predicts from the widest fixed window's acceptance (it covers the most positions)."""
    out: dict[str, dict] = {}
    ok = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("window"), int)]
    for group in sorted({r["group"] for r in ok if r["method"].startswith("draft")}):
        fixed = [r for r in ok if r["group"] == group and r["method"].startswith("draft")]
        measured = max(fixed, key=lambda r: r["tokens_per_s"])
        widest = max(fixed, key=lambda r: r["window"])
        entry = costs.get(widest.get("cost_key", ""))
        predicted_k = predicted = None
        if entry is not None and widest.get("acceptance_per_position"):
            alpha = conditional_acceptance(widest["acceptance_per_position"])
            predicted_k, predicted = cost_model(entry).best_window(
                widest["batch"], alpha, min(k_max, len(alpha))
            )
        out[group] = {
            "measured_best_k": measured["window"],
            "measured_best_speedup": measured.get("speedup"),
            "predicted_best_k": predicted_k,
            "predicted_best_speedup": None if predicted is None else round(predicted, 4),
        }
    return out
