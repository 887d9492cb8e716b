"""The benchmark's pieces without models: the predictor, the plan and the result store."""

import json

import pytest
import torch

from specdec.bench.analysis import derive
from specdec.bench.costs import cost_model, forward_seconds
from specdec.bench.plan import PRESETS, Point, build_points, check_methods, override
from specdec.bench.results import ResultStore
from specdec.errors import InvalidParameterError
from specdec.window import (
    AdaptiveWindow,
    CostModel,
    conditional_acceptance,
    expected_tokens,
    predict_speedup,
)

# ----------------------------------------------------------------------------- costs


class _Timeline:
    """A fake model on a fake clock: a pass of T tokens per row costs 1 + 0.1 T, plus 5
    while a neighbour is busy (its first `busy` passes)."""

    device = torch.device("cpu")

    def __init__(self, busy: int) -> None:
        self.now, self.passes, self.busy = 0.0, 0, busy
        self.config = type("Config", (), {"vocab_size": 50})()

    def new_cache(self, rows, length):
        lengths = torch.zeros(rows, dtype=torch.long)
        return type(
            "Cache",
            (),
            {
                "lengths": lengths,
                "advance": lambda self, n, rows: lengths.add_(n),
                "truncate": lambda self, start: lengths.copy_(start),
            },
        )()

    def __call__(self, tokens, cache):
        self.now += 1 + 0.1 * tokens.shape[1] + (5 if self.passes < self.busy else 0)
        self.passes += 1
        return type("Out", (), {"logits": torch.zeros(*tokens.shape, 50)})()


def test_pass_widths_take_turns_under_a_busy_neighbour():
    """A neighbour busy for the first 12 passes: measured one width after the other, the
    plain step (first) would be timed only while it is busy, and wider passes would look
    cheaper than a plain one. Taking turns, every width is also timed after it stops."""
    model = _Timeline(busy=12)
    times = forward_seconds(model, 2, (1, 2, 5, 9), 10, repeats=4, clock=lambda: model.now)
    assert times == pytest.approx({1: 1.1, 2: 1.2, 5: 1.5, 9: 1.9})


# ----------------------------------------------------------------------------- predictor


def test_conditional_acceptance():
    assert conditional_acceptance([]) == []
    assert conditional_acceptance([0.9, 0.81, 0.729]) == pytest.approx([0.9, 0.9, 0.9])
    assert conditional_acceptance([0.5, 0.0, 0.0]) == [0.5, 0.0, 0.0]
    # Round-trip with expected_tokens: 1 + the sum of the per-position kept fractions.
    kept = [0.96, 0.9, 0.83, 0.79]
    assert expected_tokens(conditional_acceptance(kept), 4) == pytest.approx(1 + sum(kept))


@pytest.mark.parametrize("a,c,k", [(0.8, 0.2, 4), (0.6, 0.4, 2), (0.95, 0.1, 8)])
def test_predict_speedup_is_the_design_formula(a, c, k):
    """i.i.d. acceptance a: S = (1 - a^(k+1)) / ((1 - a)(k c + v(k))) (docs/design/)."""
    step = 0.1
    v = {j: 1 + 0.02 * j for j in range(17)}  # relative verify cost
    costs = CostModel.measured(1, {j: step * v[j] for j in v}, draft_step_s=c * step)
    expected = (1 - a ** (k + 1)) / ((1 - a) * (k * c + v[k]))
    assert predict_speedup(costs, 1, [a] * k, k) == pytest.approx(expected)
    assert predict_speedup(costs, 1, [a] * k, 0) == pytest.approx(1.0)
    assert predict_speedup(CostModel(), 1, [a], k) is None


def test_best_window_is_the_argmax_of_predict_speedup():
    costs = CostModel.measured(2, {j: 0.1 * (1 + 0.03 * j) for j in range(17)}, 0.02)
    alpha = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    k, speedup = costs.best_window(2, alpha, 8)
    speedups = {j: predict_speedup(costs, 2, alpha, j) for j in range(1, 9)}
    assert k == max(speedups, key=speedups.get) and speedup == pytest.approx(speedups[k])
    # A measured batch size informs others through total tokens (CostModel's keying).
    assert costs.verify_time(1, 2) == pytest.approx(costs.verify_time(2, 1))


def _row(method, window, tokens_per_s, per_position=None, tokens_per_pass=1.0, batch=1):
    return {
        "key": f"g|{method}",
        "group": "g",
        "cost_key": "c",
        "status": "ok",
        "method": method,
        "window": window,
        "batch": batch,
        "temperature": 1.0,
        "tokens_per_s": tokens_per_s,
        "decode_tokens_per_s": tokens_per_s,
        "acceptance_per_position": per_position,
        "mean_accepted_length": tokens_per_pass,
    }


def test_derive_predictions_and_costs():
    entry = {
        "rows": 1,
        "context": 100,
        "verify_s": {str(k): 0.1 * (1 + 0.02 * k) for k in range(9)},
        "draft_step_s": 0.02,
    }
    kept = [0.9, 0.81, 0.729, 0.6561]  # i.i.d. a = 0.9
    rows = [
        _row("plain", None, 10.0),
        _row("draft-k4", 4, 25.0, kept, tokens_per_pass=1 + sum(kept)),
        _row("draft-auto", "auto", 26.0, kept),
        _row("ngram-auto", "auto", 9.9, [0.01]),
    ]
    derive(rows, {"c": entry}, k_max=4, price_per_hour=3.6)
    plain, fixed, auto, ngram = rows
    assert plain["speedup"] == 1.0 and fixed["speedup"] == 2.5
    assert plain["cost_per_million_tokens"] == pytest.approx(100.0)  # $3.6/h at 10 tok/s
    formula = (1 - 0.9**5) / ((1 - 0.9) * (4 * 0.2 + 1.08))  # c = 0.2, v(4) = 1.08
    assert fixed["predicted_speedup"] == pytest.approx(formula, rel=1e-3)
    # Measured tokens per pass over the same costs: identical here by construction.
    assert fixed["predicted_from_tokens_per_pass"] == pytest.approx(formula, rel=1e-3)
    # auto: what AdaptiveWindow would choose from these inputs.
    k, s = cost_model(entry).best_window(1, conditional_acceptance(kept), 4)
    assert auto["predicted_best_k"] == k == 4
    assert auto["predicted_speedup"] == pytest.approx(s, abs=1e-4)
    # Speculation not predicted to pay by the window's margin: plain, k = 0.
    assert ngram["predicted_best_k"] == 0 and ngram["predicted_speedup"] == 1.0
    assert AdaptiveWindow().config.margin > 0


def test_derive_without_a_plain_row_or_costs():
    rows = [_row("draft-k4", 4, 25.0, [0.9] * 4)]
    derive(rows, {}, k_max=8, price_per_hour=None)
    assert rows[0]["speedup"] is None and rows[0]["predicted_speedup"] is None
    assert rows[0]["cost_per_million_tokens"] is None


def test_a_verify_curve_of_one_width_predicts_nothing():
    """`--curve-ks 0` times a plain step alone: read as a flat curve it would price every
    window as cheap as a plain step (the Xeon sweep of 2026-11-28: 1.86x predicted, 1.11x
    measured). No prediction is made, and the report says why instead of failing it."""
    from specdec.bench.report import checks

    entry = {"rows": 1, "context": 288, "verify_s": {"0": 0.05}, "draft_step_s": 0.017}
    kept = [0.84, 0.66, 0.5]
    rows = [_row("plain", None, 14.0), _row("draft-auto", "auto", 15.0, kept)]
    derive(rows, {"c": entry}, k_max=8, price_per_hour=None)
    assert rows[1]["predicted_speedup"] is None and rows[1]["predicted_best_k"] is None
    line = next(line for line in checks(rows) if "predicted vs measured" in line)
    assert "not checked" in line and "--curve-ks" in line
    entry["verify_s"]["1"] = 0.052  # two widths: a curve to price with
    derive(rows, {"c": entry}, k_max=8, price_per_hour=None)
    assert rows[1]["predicted_speedup"] > 0
    line = next(line for line in checks(rows) if "predicted vs measured" in line)
    assert "not checked" not in line


def test_paired_speedup_pairs_runs_of_the_same_turns_and_the_floor_check_uses_it():
    """The machine slows down between turns: `auto`'s median run reads 0.90x plain's median
    run, yet in every turn it ran at 0.99x plain's run beside it. The floor check judges
    the paired figure; rows from different turns (or one run) keep `speedup` alone."""
    from specdec.bench.report import checks

    plain = _row("plain", None, 10.0) | {"turns": "t1", "runs_tokens_per_s": [10.0, 8.0, 10.0]}
    auto = _row("draft-auto", "auto", 9.0) | {"turns": "t1", "runs_tokens_per_s": [9.9, 7.92, 9.9]}
    rows = [plain, auto]
    derive(rows, {}, k_max=4, price_per_hour=None)
    assert auto["speedup"] == 0.9 and auto["paired_speedup"] == pytest.approx(0.99)
    assert plain["paired_speedup"] == 1.0
    assert "**yes** at all 1 points" in checks(rows)[0] and "per-turn" in checks(rows)[0]
    for other in ({"turns": "t0"}, {"turns": None}, {"runs_tokens_per_s": [9.9]}):
        rows = [dict(plain), auto | other]
        rows[0]["runs_tokens_per_s"] = rows[0]["runs_tokens_per_s"][
            : len(rows[1]["runs_tokens_per_s"])
        ]
        derive(rows, {}, k_max=4, price_per_hour=None)
        assert rows[1]["paired_speedup"] is None and "**no**" in checks(rows)[0]


def test_the_floor_is_judged_by_an_interval_over_paired_requests():
    """Twelve prompts in two turns; the second turn ran 20% slower for every method. Each
    request is paired with plain's of the same prompt in the same turn: the geometric mean
    and its t interval (24 pairs: t(23) = 2.069) come out as computed by hand, and the
    floor line judges the lower bound, not the mean."""
    import math
    import statistics

    from specdec.bench.report import checks

    plain_rates = [10.0 + i for i in range(12)]
    ratios = [0.95, 1.02, 1.10, 0.99, 1.05, 1.00, 0.97, 1.08, 1.01, 0.96, 1.04, 1.03]

    def rows_for(shift):
        turns = [[p * t for p in plain_rates] for t in (1.0, 0.8)]
        plain = _row("plain", None, 10.0) | {"turns": "t1", "runs_request_tokens_per_s": turns}
        auto_turns = [[p * (r + shift) for p, r in zip(run, ratios, strict=True)] for run in turns]
        auto = _row("draft-auto", "auto", 10.0) | {
            "turns": "t1", "runs_request_tokens_per_s": auto_turns
        }  # fmt: skip
        rows = [plain, auto]
        derive(rows, {}, k_max=4, price_per_hour=None)
        return rows

    plain, auto = rows_for(0.0)
    logs = [math.log(r) for r in ratios] * 2
    half = 2.069 * statistics.stdev(logs) / math.sqrt(24)
    mean = statistics.fmean(logs)
    assert auto["request_speedup"] == pytest.approx(math.exp(mean), abs=1e-4)
    assert auto["request_speedup_low"] == pytest.approx(math.exp(mean - half), abs=2e-4)
    assert auto["request_speedup_high"] == pytest.approx(math.exp(mean + half), abs=2e-4)
    assert plain["request_speedup"] == 1.0
    line = next(line for line in checks([plain, auto]) if "95% interval" in line)
    assert "**yes**" in line
    plain, auto = rows_for(-0.035)  # mean ~0.98x: above the floor, its interval not
    assert auto["request_speedup"] > 0.97 > auto["request_speedup_low"]
    assert "**no**" in next(line for line in checks([plain, auto]) if "95% interval" in line)
    auto["runs_request_tokens_per_s"] = [run[:2] for run in auto["runs_request_tokens_per_s"]]
    derive([plain, auto], {}, k_max=4, price_per_hour=None)  # 4 pairs: too few for t
    assert auto["request_speedup"] is None


def test_the_cpu_time_floor_check_pairs_runs_of_the_same_turns():
    """In CPU time too: the median runs come from different turns and read 0.90x, while in
    every turn auto used 0.99x plain's CPU per token; the CPU line judges the per-turn
    figure, and falls back to the median runs' where the rows took no common turns."""
    from specdec.bench.report import checks

    plain = _row("plain", None, 10.0) | {"turns": "t1", "cpu_tokens_per_s": 10.0}
    auto = _row("draft-auto", "auto", 9.9) | {"turns": "t1", "cpu_tokens_per_s": 9.0}
    plain["runs_cpu_tokens_per_s"] = [10.0, 8.0, 10.0]
    auto["runs_cpu_tokens_per_s"] = [9.9, 7.92, 9.9]
    rows = [plain, auto]
    derive(rows, {}, k_max=4, price_per_hour=None)
    assert auto["cpu_speedup"] == 0.9 and auto["paired_cpu_speedup"] == pytest.approx(0.99)
    cpu_line = next(line for line in checks(rows) if "CPU second" in line)
    assert "**yes**" in cpu_line and "per-turn" in cpu_line
    rows = [plain, auto | {"turns": "t0"}]
    derive(rows, {}, k_max=4, price_per_hour=None)
    assert rows[1]["paired_cpu_speedup"] is None
    assert "**no**" in next(line for line in checks(rows) if "CPU second" in line)


def test_paired_decode_speedup_leaves_out_the_prefills_spread():
    """A long prompt: each run is 10 s of prefill (the same work for every method) and 5 s
    of decode. In two turns of three plain's prefill happened to take 8 s and auto's 12 s:
    end to end auto reads 0.76x plain by the per-turn median and fails the floor, yet its
    decode ran as fast as plain's in every turn. The decode line of the floor check judges
    the decode alone and passes; with auto's decode 10% slower it fails."""
    from specdec.bench.report import checks

    def runs(decode_s, prefill_s):  # 100 tokens, 4 requests: 96 after each one's first
        return {
            "runs_tokens_per_s": [100 / (d + p) for d, p in zip(decode_s, prefill_s, strict=True)],
            "runs_decode_tokens_per_s": [96 / d for d in decode_s],
            "turns": "t1",
        }

    for slower, verdict in ((1.0, "**yes**"), (1.1, "**no**")):
        plain = _row("plain", None, 100 / 15) | runs([5, 5, 5], [8, 8, 10])
        auto = _row("draft-auto", "auto", 100 / 15) | runs([5 * slower] * 3, [12, 12, 10])
        rows = [plain, auto]
        derive(rows, {}, k_max=4, price_per_hour=None)
        assert auto["paired_decode_speedup"] == pytest.approx(1 / slower, abs=1e-3)
        wall, decode = checks(rows)[:2]
        assert "**no**" in wall and "decode phase alone" in decode and verdict in decode
    auto["runs_decode_tokens_per_s"][0] = None  # a run with no decode: no paired figure
    derive(rows, {}, k_max=4, price_per_hour=None)
    assert auto["paired_decode_speedup"] is None


def test_finish_keeps_every_runs_decode_rate():
    """Each run's decode tokens/s is its tokens after each request's first over its wall
    time less its prefills, in run order beside its end-to-end rate."""
    from types import SimpleNamespace

    from specdec.bench import runner as bench_runner
    from specdec.stats import SpecStats

    runner = object.__new__(bench_runner.Runner)
    runner.tp, runner.llm = 1, SimpleNamespace(tp=None)
    point = Point("code", None, 2, 0.0, "plain")
    trial = bench_runner.Trial(point, [[5, 6], [7]], lambda: iter(()))
    stats = [SpecStats(generated=6), SpecStats(generated=6)]
    for wall, prefill in ((3.0, 1.0), (4.0, 3.0), (2.0, 1.0)):
        trial.runs.append((wall, wall, [[1] * 6, [2] * 6], stats, prefill))
    row = runner.finish(trial)
    assert row["runs_tokens_per_s"] == [4.0, 3.0, 6.0]
    assert row["runs_decode_tokens_per_s"] == [5.0, 10.0, 10.0]
    assert row["runs_cpu_tokens_per_s"] == [4.0, 3.0, 6.0]  # CPU s = wall s here


def _turn_runner(monkeypatch, rounds_per_run: int, order: list, repeats: int = 3):
    """A Runner whose points run `rounds_per_run` rounds, logging (method, round) as they
    run; llama.cpp cannot start."""
    from types import SimpleNamespace

    from specdec.bench import runner as bench_runner

    runner = object.__new__(bench_runner.Runner)
    runner.repeats, runner.tp, runner.llm = repeats, 1, SimpleNamespace(tp=None)

    def start(self, point):
        if point.method == "llamacpp":
            raise bench_runner.Skip("not installed")

        def rounds():
            for r in range(rounds_per_run):
                order.append((point.method, r))
                yield
            return [[1, 2, 3]] * rounds_per_run, None, 0.0

        return bench_runner.Trial(point, [[5, 6]] * rounds_per_run, rounds)

    monkeypatch.setattr(bench_runner.Runner, "start", start)
    return runner


def test_methods_of_a_group_take_turns(monkeypatch):
    """Every method's first run, then every second run in the reverse order, then every
    third starting one method later; a point that cannot start is returned as its error,
    the others' rows share their turns and keep every run in order."""
    from specdec.bench import runner as bench_runner

    order = []
    runner = _turn_runner(monkeypatch, 1, order)
    methods = ("plain", "draft-auto", "llamacpp", "draft-k2")
    results = runner.measure_group([Point("code", None, 1, 0.0, m) for m in methods])
    assert [m for m, _ in order] == ["plain", "draft-auto", "draft-k2"] + [
        "draft-k2",
        "draft-auto",
        "plain",
    ] + ["draft-auto", "draft-k2", "plain"]
    assert isinstance(results[2], bench_runner.Skip)
    rows = [results[0], results[1], results[3]]
    assert len({r["turns"] for r in rows}) == 1 and rows[0]["turns"] is not None
    assert all(len(r["runs_tokens_per_s"]) == 3 for r in rows)


@pytest.mark.parametrize("n_methods", [2, 3])
def test_every_pair_of_methods_meets_in_both_orders(monkeypatch, n_methods):
    """Over 2 x n turns each method runs before and after each other method equally often
    (with 2 or 3 methods, in every order), so that no method is systematically the later
    run of its pairs with plain."""
    order = []
    runner = _turn_runner(monkeypatch, 1, order, repeats=2 * n_methods)
    methods = ("plain", "draft-auto", "draft-k2")[:n_methods]
    runner.measure_group([Point("code", None, 1, 0.0, m) for m in methods])
    turns = [tuple(m for m, _ in order[t : t + n_methods]) for t in range(0, len(order), n_methods)]
    assert len(turns) == 2 * n_methods
    for a in methods:
        for b in methods:
            if a != b:
                before = sum(turn.index(a) < turn.index(b) for turn in turns)
                assert before == n_methods, (a, b, turns)
    if n_methods == 3:
        assert len(set(turns)) == 6


def test_runs_in_turns_alternate_round_by_round(monkeypatch):
    """A run of several rounds (batches of requests) takes its turns round by round, each
    round starting one method later: drift over a run's seconds hits every method's
    rounds alike, where whole runs in turn saw different minutes."""
    order = []
    runner = _turn_runner(monkeypatch, 2, order)
    methods = ("plain", "draft-auto", "draft-k2")
    results = runner.measure_group([Point("code", None, 1, 0.0, m) for m in methods])
    first_run = order[:6]
    assert first_run == [
        ("plain", 0), ("draft-auto", 0), ("draft-k2", 0),
        ("draft-auto", 1), ("draft-k2", 1), ("plain", 1),
    ]  # fmt: skip
    assert order[6:9] == [("draft-k2", 0), ("draft-auto", 0), ("plain", 0)]  # reversed
    assert len(order) == 3 * 2 * 3
    assert all(r["generated_tokens"] == 6 and len(r["runs_tokens_per_s"]) == 3 for r in results)


def test_a_group_stopped_between_turns_resumes_at_its_next_turn(monkeypatch, tmp_path):
    """Each finished turn is saved; a sweep stopped in the third turn takes the first two
    from the log and runs only the third, with the first turns' runs and stamp kept as
    measured (stats included), and a log of other methods is not taken."""
    from specdec.bench import runner as bench_runner
    from specdec.bench.turn_log import TurnLog
    from specdec.stats import SpecStats

    methods = ("plain", "draft-auto", "draft-k2")
    points = [Point("code", None, 1, 0.0, m) for m in methods]
    order = []
    runner = _turn_runner(monkeypatch, 1, order)
    runner._carried = {}
    start = bench_runner.Runner.start

    def stopping_start(self, point):
        trial = start(self, point)
        inner = trial.rounds

        def rounds():
            if len(order) == 6:  # the third turn's first round: the session ends here
                raise KeyboardInterrupt
            stats = yield from inner()
            return stats[0], [SpecStats(generated=3, steps=len(order))], 0.5

        trial.rounds = rounds
        return trial

    monkeypatch.setattr(bench_runner.Runner, "start", stopping_start)
    log = TurnLog(tmp_path, points[0].group, list(methods))
    with pytest.raises(KeyboardInterrupt):
        runner.measure_group(points, log)
    saved = log.load()
    assert saved.done == 2 and set(saved.runs) == {p.key for p in points}
    first_turns = saved.runs

    order.clear()
    order.extend([None] * 7)  # past the stop
    results = runner.measure_group(points, log)
    assert [m for m, _ in order[7:]] == ["draft-auto", "draft-k2", "plain"]  # the third turn only
    assert all(len(r["runs_tokens_per_s"]) == 3 for r in results)
    assert len({r["turns"] for r in results}) == 1 and results[0]["turns"] == saved.started
    again = TurnLog(tmp_path, points[0].group, list(methods))
    assert again.load().done == 3
    for key, runs in first_turns.items():
        assert again.load().runs[key][:2] == runs  # SpecStats back as SpecStats
    assert TurnLog(tmp_path, points[0].group, ["plain", "draft-auto"]).load() is None
    again.clear()
    assert again.load() is None


# ----------------------------------------------------------------------------- plan


def test_points_plain_first_and_batch1_only_peers():
    preset = override(
        PRESETS["full"], batches=(1, 4), temperatures=(0.0,), workloads=("code", "synthetic")
    )
    points = build_points(preset)
    groups = {}
    for p in points:
        groups.setdefault(p.group, []).append(p.method)
    assert all(methods[0] == "plain" for methods in groups.values())
    assert len(groups) == 2 * (1 + 3)  # code (natural length) + 3 synthetic lengths
    assert not [p for p in points if p.batch == 4 and p.method in ("hf-assisted", "llamacpp")]
    assert len({p.key for p in points}) == len(points)


def test_point_keys_and_windows():
    p = Point("synthetic", 64, 4, 1.0, "draft-k8")
    assert p.key == "synthetic|len=64|batch=4|temp=1|draft-k8" and p.window == 8
    assert p.cost_key == "synthetic|len=64|batch=4"
    assert Point("code", None, 1, 0.0, "ngram-auto").window == "auto"
    assert Point("code", None, 1, 0.0, "hf-generate").window is None
    assert Point("code", None, 1, 0.0, "vllm-draft-k4").window is None  # a peer's own k
    check_methods(("plain", "vllm", "vllm-draft-k4"))
    from specdec.bench.plan import vllm_draft_k

    assert [vllm_draft_k(m) for m in ("vllm", "vllm-draft-k4", "draft-k4")] == [0, 4, None]


def test_bad_methods():
    with pytest.raises(InvalidParameterError, match="unknown method"):
        check_methods(("plain", "draft-kx"))
    with pytest.raises(InvalidParameterError, match="must include plain"):
        check_methods(("draft-auto",))


# ----------------------------------------------------------------------------- resume


def test_store_resumes_ok_rows_and_retries_skipped(tmp_path):
    config = {"model": "m", "dtype": "bf16"}
    store = ResultStore(tmp_path, config)
    store.add({"key": "a", "status": "ok", "method": "plain", "tokens_per_s": 1.0})
    store.add({"key": "b", "status": "skipped", "method": "llamacpp", "reason": "absent"})
    store.costs["c"] = {"rows": 1}
    store.save({"machine": "here"})
    again = ResultStore(tmp_path, config)
    assert again.done("a") and not again.done("b") and not again.done("z")
    assert again.costs == {"c": {"rows": 1}}
    assert json.loads((tmp_path / "results.json").read_text())["machine"] == "here"
    assert not list(tmp_path.glob("*.tmp"))
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == 3 and "absent" in lines[2]


def test_store_refuses_another_config(tmp_path):
    ResultStore(tmp_path, {"model": "m", "dtype": "bf16"}).save()
    with pytest.raises(InvalidParameterError, match=r"dtype: 'bf16' -> 'fp32'"):
        ResultStore(tmp_path, {"model": "m", "dtype": "fp32"})


def test_store_merges_slices_of_one_config(tmp_path):
    """Two slices measured side by side into their own folders, merged into a third: every
    ok row and cost is taken once; rows the store holds already win; another config is
    refused."""
    config = {"model": "m", "max_tokens": 64}
    a, b = ResultStore(tmp_path / "a", config), ResultStore(tmp_path / "b", config)
    a.add({"key": "x|plain", "status": "ok", "wall_s": 1.0})
    a.costs["x"] = {"rows": 1}
    b.add({"key": "y|plain", "status": "ok", "wall_s": 2.0})
    b.add({"key": "x|plain", "status": "ok", "wall_s": 9.0})
    a.save()
    b.save()
    merged = ResultStore(tmp_path / "all", config)
    assert merged.merge(tmp_path / "a") == 1
    assert merged.merge(tmp_path / "b") == 1  # x|plain is already there
    assert merged.rows["x|plain"]["wall_s"] == 1.0 and merged.done("y|plain")
    assert merged.costs == {"x": {"rows": 1}}
    other = ResultStore(tmp_path / "other", {"model": "m", "max_tokens": 128})
    with pytest.raises(InvalidParameterError, match="another configuration"):
        other.merge(tmp_path / "a")
    with pytest.raises(InvalidParameterError, match="no results.json"):
        merged.merge(tmp_path / "missing")


def test_a_llamacpp_build_with_amx_is_refused_on_a_cpu_with_amx():
    from specdec.bench.peers import llamacpp_amx_problem

    amx_build = "CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 | "
    plain_build = "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | OPENMP = 1 | "
    problem = llamacpp_amx_problem(amx_build, {"avx512f", "amx_tile", "amx_int8"})
    assert problem is not None and "GGML_AMX_INT8=OFF" in problem
    assert llamacpp_amx_problem(plain_build, {"avx512f", "amx_tile", "amx_int8"}) is None
    assert llamacpp_amx_problem(amx_build, {"avx2", "avx512f"}) is None  # no AMX to crash on


def test_a_run_frees_its_engine_before_the_next_run_starts(monkeypatch):
    """Each run's engine (its caches) is released within the run's own last round, so the
    turn's next run does not start beside it."""
    import gc
    import weakref
    from types import SimpleNamespace

    from specdec.bench import runner as bench_runner

    engines = []

    class FakeEngine:
        prefill_s, window = 0.0, None

        def generate(self, prompts, params):
            return [SimpleNamespace(token_ids=[1], stats=None) for _ in prompts]

    def make_engine(self, point):
        engine = FakeEngine()
        engines.append(weakref.ref(engine))
        return engine

    monkeypatch.setattr(bench_runner.Runner, "_engine", make_engine)
    runner = object.__new__(bench_runner.Runner)
    config = SimpleNamespace(max_position_embeddings=4096)
    runner.llm = SimpleNamespace(model=SimpleNamespace(config=config))
    runner.max_tokens, runner.k_max, runner.interleave = 8, 4, "rounds"
    point = Point("code", None, 2, 0.0, "plain")
    _, rounds = runner._engine_runner(point, [[5, 6]] * 4, [None] * 4)
    run = rounds()
    next(run)  # the first of two rounds: the engine is in use
    gc.collect()
    assert engines[0]() is not None
    next(run)  # the last round
    gc.collect()
    assert engines[0]() is None
    with pytest.raises(StopIteration) as done:
        next(run)
    assert done.value.value[0] == [[1]] * 4


def test_a_llamacpp_install_that_does_not_import_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    import builtins

    from specdec.bench.peers import llamacpp_model

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ModuleNotFoundError("No module named 'diskcache'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(RuntimeError, match="does not import .*diskcache.*without --no-deps"):
        llamacpp_model(tmp_path / "model.gguf", 256)


def test_vllm_runs_fp32_beside_bf16_on_a_cpu_without_bf16(monkeypatch):
    """vLLM's CPU build cannot multiply bf16 without the instructions: the peer runs in
    fp32 there (recorded as the row's `peer_dtype`), and in our dtype elsewhere."""
    import torch

    from specdec.bench.vllm_peer import vllm_dtype

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert vllm_dtype("bf16") == "fp32" and vllm_dtype("fp32") == "fp32"
    assert vllm_dtype("bf16", "cuda") == "bf16"
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert vllm_dtype("bf16") == "bf16"
