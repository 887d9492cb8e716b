"""`specdec bench` end to end on a tiny model: the files and fields exist, the numbers are
sane (not their values: tiny models on a shared CPU time nothing useful), and a second run
into the same folder resumes instead of measuring again."""

import json
import os

import pytest

from specdec.bench import runner as bench_runner
from specdec.cli import main

from tiny import hf_tiny, tiny_tokenizer

PLOTS = (
    "speedup_vs_batch.png",
    "tokens_per_s.png",
    "acceptance_by_position.png",
    "predicted_vs_measured.png",
    "verify_cost.png",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-bench")
    hf_tiny("qwen2").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _bench(model_dir, out, *extra):
    return main(
        [
            "bench",
            "--model", str(model_dir),
            "--draft", str(model_dir),
            "--dtype", "fp32",
            "--draft-quant", "none",
            "--workloads", "code,synthetic",
            "--synthetic-source", "code",
            "--prompt-lens", "24",
            "--methods", "plain,draft-k2,draft-auto,ngram-auto,hf-generate,hf-assisted,llamacpp",
            "--max-tokens", "6",
            "--prompts-per-point", "2",
            "--curve-ks", "0,1,2,4",
            "--price-per-hour", "2",
            "--out", str(out),
            *extra,
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def bench_out(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    assert _bench(model_dir, out, "--batches", "1,2", "--temperatures", "0") == 0
    return out


def test_files_and_fields(bench_out):
    for name in ("results.json", "results.csv", "summary.md", *PLOTS):
        assert (bench_out / name).is_file(), name
    assert not any((bench_out / "turns").glob("*")), "a finished group leaves no turn log"
    data = json.loads((bench_out / "results.json").read_text())
    assert data["config"]["model"].endswith("tiny-bench0") or data["config"]["model"]
    assert "logical CPUs" in data["machine"] and data["command"].startswith("specdec bench")
    rows = {r["key"]: r for r in data["rows"]}
    ok = [r for r in rows.values() if r["status"] == "ok"]
    # 2 workloads x 2 batch sizes, 5 methods each, hf-assisted at batch 1 only.
    assert len(ok) == 2 * 2 * 5 + 2
    for row in ok:
        assert row["tokens_per_s"] > 0 and row["generated_tokens"] > 0
        assert row["speedup"] > 0 and row["cost_per_million_tokens"] > 0
        assert row["requests"] == 2
        assert row["peak_rss_mb"] > 50  # this process, its models loaded, while it ran
        # The threads' arithmetic when the point finished (None with one thread).
        assert row["threads_scaling"] is None or row["threads_scaling"] > 0
        if row["method"] == "plain":
            assert row["speedup"] == 1.0 and row["mean_accepted_length"] == 1.0
        if not row["method"].startswith("hf"):
            assert 0 < row["tpot_median_s"] <= row["tpot_p90_s"]
            assert row["ttft_median_s"] > 0 and row["decode_speedup"] > 0
            assert row["cpu_speedup"] > 0 and row["cpu_s"] > 0
            # fp32: every engine method reproduces plain greedy decoding exactly.
            assert row["same_output_as_plain"] == 1.0, row["key"]
        if row["window"] == "auto" and not row["drafted_tokens"]:
            # The draft is the target itself (its catch-up costs a whole prefill, its step a
            # plain one): auto may rightly never start; then it decoded plainly.
            assert row["acceptance_rate"] is None and row["mean_accepted_length"] == 1.0
        elif row["window"] is not None:
            assert 0 <= row["acceptance_rate"] <= 1 and row["mean_accepted_length"] >= 1
            assert all(0 <= a <= 1 for a in row["acceptance_per_position"])
            assert row["predicted_speedup"] > 0
        if row["method"] == "draft-k2":
            assert len(row["acceptance_per_position"]) == 2
            assert row["predicted_from_tokens_per_pass"] > 0
    # The draft is the target itself: it is always right.
    assert rows["code|len=natural|batch=1|temp=0|draft-k2"]["acceptance_rate"] == 1.0
    # llama.cpp is optional: the point is skipped with the reason.
    skipped = [r for r in rows.values() if r["status"] == "skipped"]
    assert skipped and all(r["method"] == "llamacpp" for r in skipped)
    costs = data["costs"]["code|len=natural|batch=1"]
    assert set(costs["v"]) == {"0", "1", "2", "4"} and costs["c"] > 0

    csv_lines = (bench_out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("workload,prompt_len") and len(csv_lines) == 1 + len(rows)
    summary = (bench_out / "summary.md").read_text()
    for heading in ("## Checks", "## All points", "## Cost model", "## Skipped", "## Plots"):
        assert heading in summary
    # The tiny vocabulary is below the default cut: the draft's head was scored whole.
    assert data["draft_head"] == "whole" and "(its vocabulary head: whole)" in summary
    # Without the extra it is not installed; with it, the tiny model has no GGUF file.
    from specdec.bench.peers import llamacpp_available

    reason = "no GGUF file" if llamacpp_available() else "llama-cpp-python is not installed"
    assert reason in summary


def test_resume_measures_only_new_points(model_dir, bench_out, monkeypatch):
    measured = []
    original = bench_runner.Runner.start

    def counting(self, point):
        measured.append(point.key)
        return original(self, point)

    monkeypatch.setattr(bench_runner.Runner, "start", counting)
    before = json.loads((bench_out / "results.json").read_text())["rows"]
    # The same sweep plus temperature 1 at batch 1: only the new points (and the skipped
    # llama.cpp ones, tried again) are measured; the old rows stay as they were.
    assert _bench(model_dir, bench_out, "--batches", "1", "--temperatures", "0,1") == 0
    new = [k for k in measured if "temp=1" in k]
    assert len(new) == 2 * 7 and not [k for k in measured if "temp=0" in k and "llamacpp" not in k]
    after = {r["key"]: r for r in json.loads((bench_out / "results.json").read_text())["rows"]}
    for row in before:
        if row["status"] == "ok":
            assert after[row["key"]]["tokens_per_s"] == row["tokens_per_s"]


def test_another_config_is_refused(model_dir, bench_out, capsys):
    code = _bench(model_dir, bench_out, "--batches", "1", "--ignore-eos")
    assert code == 2
    assert "another configuration" in capsys.readouterr().err


def test_remeasure_costs_only(model_dir, bench_out, monkeypatch):
    """--remeasure-costs on a finished sweep measures costs again and no point."""
    calls = {"costs": 0, "measure": 0}

    def costs(self, point, ks):
        calls["costs"] += 1
        return {"rows": point.batch, "context": 10, "verify_s": {"0": 1.0, "2": 1.1},
                "draft_step_s": 0.1, "c": 0.1, "v": {"0": 1.0, "2": 1.1}}  # fmt: skip

    def measure(self, point):
        calls["measure"] += 1
        raise AssertionError("no point should be measured")

    monkeypatch.setattr(bench_runner.Runner, "costs", costs)
    monkeypatch.setattr(bench_runner.Runner, "start", measure)
    args = ["--batches", "1,2", "--temperatures", "0", "--methods", "plain,draft-k2"]
    assert _bench(model_dir, bench_out, *args, "--remeasure-costs") == 0
    assert calls == {"costs": 4, "measure": 0}  # 2 workloads x 2 batch sizes
    rows = json.loads((bench_out / "results.json").read_text())["rows"]
    k2 = [r for r in rows if r["method"] == "draft-k2" and r["batch"] == 1]
    # predicted from the new costs: v(2) = 1.1, c = 0.1
    for r in k2:
        alpha = r["acceptance_per_position"]
        expected = (1 + alpha[0] + alpha[1]) / (2 * 0.1 + 1.1)
        assert r["predicted_speedup"] == pytest.approx(expected, abs=1e-3)


def test_speculator_heads_methods(model_dir, tmp_path):
    """--heads adds trained-heads methods beside the draft model: a chain at fixed k, `auto`
    and a candidate tree, each exact in fp32, with the heads' own measured step cost."""
    import torch

    from specdec.heads import build_speculator

    from tiny import native_from_hf

    spec = build_speculator(native_from_hf(hf_tiny("qwen2")), n_predict=3)
    torch.manual_seed(1)
    with torch.no_grad():  # past the zero-initialised adapter: heads that pick real tokens
        for p in spec.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    spec.save(tmp_path / "heads")
    out = tmp_path / "out"
    code = _bench(
        model_dir, out, "--batches", "1,2", "--temperatures", "0,1", "--workloads", "code",
        "--methods", "plain,draft-k2,heads-k2,heads-auto,heads-tree",
        "--heads", str(tmp_path / "heads"), "--heads-tree", "2,2",
    )  # fmt: skip
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["heads_tree"] == [2, 2] and "--heads-tree 2,2" in data["command"]
    rows = [r for r in data["rows"] if r["method"].startswith("heads")]
    assert len(rows) == 3 * 2 * 2 and all(r["status"] == "ok" for r in rows)
    for row in rows:
        assert row["generated_tokens"] > 0 and row["mean_accepted_length"] >= 1
        if row["temperature"] == 0:
            assert row["same_output_as_plain"] == 1.0, row["key"]
        if row["method"] == "heads-k2":
            assert len(row["acceptance_per_position"]) == 2 and row["predicted_speedup"] > 0
        if row["method"] == "heads-tree":
            assert row["window"] == "tree" and row["predicted_speedup"] is None
    costs = data["costs"]["code|len=natural|batch=2"]
    assert costs["heads_step_s"] > 0 and costs["heads_c"] > 0


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_an_eagle_head_as_heads(model_dir, tmp_path, kind):
    """--heads takes an eagle or EAGLE-3 head directory too: chains at fixed k and `auto`
    and a candidate tree, exact in fp32, priced by its own measured step."""
    import torch

    from specdec.heads.eagle import build_eagle
    from specdec.heads.eagle3 import build_eagle3

    from tiny import native_from_hf

    if kind == "eagle":
        head = build_eagle(native_from_hf(hf_tiny("qwen2")), intermediate_size=32, n_predict=3)
    else:  # three distinct layers to read: a target of three
        model_dir = tmp_path / "three-layers"
        hf = hf_tiny("qwen2", num_hidden_layers=3)
        hf.save_pretrained(model_dir)
        tiny_tokenizer().save_pretrained(model_dir)
        head = build_eagle3(native_from_hf(hf), intermediate_size=32, n_predict=3)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    head.save(tmp_path / "eagle")
    out = tmp_path / "out"
    code = _bench(
        model_dir, out, "--batches", "1,2", "--temperatures", "0", "--workloads", "code",
        "--methods", "plain,heads-k2,heads-auto,heads-tree",
        "--heads", str(tmp_path / "eagle"), "--heads-tree", "2,2",
    )  # fmt: skip
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    rows = {(r["method"], r["batch"]): r for r in data["rows"]}
    for batch in (1, 2):
        for method in ("heads-k2", "heads-auto", "heads-tree"):
            row = rows[method, batch]
            assert row["status"] == "ok" and row["same_output_as_plain"] == 1.0, row["key"]
    costs = data["costs"]["code|len=natural|batch=2"]
    assert costs["heads_step_s"] > 0 and costs["heads_c"] > 0


def test_heads_methods_without_heads_are_skipped(model_dir, tmp_path):
    out = tmp_path / "out"
    args = ["--batches", "1", "--temperatures", "0", "--workloads", "code"]
    assert _bench(model_dir, out, *args, "--methods", "plain,heads-auto") == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    [heads] = [r for r in rows if r["method"] == "heads-auto"]
    assert heads["status"] == "skipped" and "--heads" in heads["reason"]


def test_warm_auto_runs_start_from_the_previous_run(model_dir, tmp_path, monkeypatch):
    """`draft-auto-warm` starts each run from the costs and acceptance its previous run
    ended with (an unmeasured full run first), as a process starts from the cost cache;
    `draft-auto` starts every run from nothing."""
    started = []  # (method, the window's state when its engine is built, the window)
    original = bench_runner.Runner._engine

    def state(window) -> list:
        return json.loads(json.dumps([window.costs.to_json(), window.acceptance_state()]))

    def recording(self, point):
        engine = original(self, point)
        if point.window == "auto":
            started.append((point.method, state(engine.window), engine.window))
        return engine

    monkeypatch.setattr(bench_runner.Runner, "_engine", recording)
    out = tmp_path / "out"
    args = ["--batches", "1", "--temperatures", "0", "--workloads", "code", "--repeats", "3"]
    assert _bench(model_dir, out, *args, "--methods", "plain,draft-auto,draft-auto-warm") == 0
    cold = [s for s in started if s[0] == "draft-auto"]
    warm = [s for s in started if s[0] == "draft-auto-warm"]
    assert len(cold) == 4 and len(warm) == 4  # a warm-up run and 3 timed runs each
    for _, (costs, acceptance), _ in cold + warm[:1]:
        assert not costs["verify_s"] and not acceptance["reached"]
    for (*_, before), (_, at_start, _) in zip(warm[:-1], warm[1:], strict=True):
        assert at_start[0]["verify_s"] and at_start == state(before)
    rows = json.loads((out / "results.json").read_text())["rows"]
    [row] = [r for r in rows if r["method"] == "draft-auto-warm"]
    assert row["status"] == "ok" and row["window"] == "auto" and row["same_output_as_plain"] == 1.0
    per_request = row["runs_request_tokens_per_s"]  # every run's requests, to pair by prompt
    assert len(per_request) == 3 and {len(run) for run in per_request} == {row["requests"]}
    assert row["request_speedup_low"] <= row["request_speedup"] <= row["request_speedup_high"]
    summary = (out / "summary.md").read_text()
    assert "`auto` at or above 0.97x plain decoding (tokens/s" in summary
    assert "95% interval over requests paired with plain's" in summary
    assert "all 2 points" in summary or "of 2 points" in summary  # both auto rows judged


def test_a_script_gets_the_runner_the_bench_measures_with(model_dir, bench_out):
    from specdec.bench.cli import runner_for
    from specdec.bench.plan import Point

    runner = runner_for(
        "--model", str(model_dir),
        "--draft", str(model_dir),
        "--dtype", "fp32",
        "--draft-quant", "none",
        "--synthetic-source", "code",
        "--max-tokens", "6",
        "--prompts-per-point", "2",
    )  # fmt: skip
    try:
        assert (runner.max_tokens, runner.prompts_per_point, runner.k_max) == (6, 2, 8)
        # The same prompts and greedy tokens as the bench's plain point of that group.
        point = Point("synthetic", 24, 1, 0.0, "plain")
        prompts = runner.prompts(point)
        outs = runner._engine(point).generate(prompts, runner.params(point, len(prompts)))
        rows = json.loads((bench_out / "results.json").read_text())["rows"]
        plain = next(r for r in rows if r["key"] == point.key)
        assert [o.token_ids for o in outs] == plain["token_ids"]
    finally:
        runner.close()


def _methods_of_engines(monkeypatch) -> dict[int, str]:
    """id(engine) -> method, for every engine the bench's runner builds from now on."""
    methods_of = {}
    original = bench_runner.Runner._engine

    def recording(self, point):
        engine = original(self, point)
        methods_of[id(engine)] = point.method
        return engine

    monkeypatch.setattr(bench_runner.Runner, "_engine", recording)
    return methods_of


def test_interleave_steps_takes_turns_step_by_step(model_dir, tmp_path, monkeypatch):
    """With `--interleave steps` our engines' runs take turns one engine step at a time
    (here a run is a single round, which `rounds` would run whole), give the same tokens,
    and the folder and its command say how they were interleaved."""
    from specdec.engine import Engine

    methods_of = _methods_of_engines(monkeypatch)
    stepped = []
    decode = Engine.decode

    def logging_decode(self):
        stepped.append(methods_of.get(id(self)))
        return decode(self)

    monkeypatch.setattr(Engine, "decode", logging_decode)
    out = tmp_path / "out"
    args = ["--batches", "2", "--temperatures", "0", "--workloads", "code", "--repeats", "2"]
    methods = ["--methods", "plain,draft-auto,ngram-auto", "--interleave", "steps"]
    assert _bench(model_dir, out, *args, *methods) == 0
    timed = [m for m in stepped if m is not None][-30:]  # past the warm-up runs
    switches = sum(a != b for a, b in zip(timed[:-1], timed[1:], strict=True))
    assert switches >= len(timed) // 2  # whole runs in turn would switch twice a turn
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["interleave"] == "steps"
    rows = [r for r in data["rows"] if r["status"] == "ok"]
    assert len(rows) == 3 and all(r["same_output_as_plain"] == 1.0 for r in rows[1:])
    assert all(len(r["runs_tokens_per_s"]) == 2 for r in rows)
    assert "--interleave steps" in (out / "summary.md").read_text()


def test_prefill_chunks_take_turns_inside_a_prefill(model_dir, tmp_path, monkeypatch):
    """With `--prefill-chunk` and `--interleave steps` a long prefill is taken in passes,
    and the methods take turns between them: one method's passes of an admission are
    interleaved with the others'. The output is still plain's, and the folder and its
    command record the chunk."""
    from specdec.engine import Engine

    methods_of = _methods_of_engines(monkeypatch)
    passed = []
    passes = Engine._prefill_passes

    def logging_passes(self, seqs, first_row):
        inner = passes(self, seqs, first_row)
        while True:
            passed.append(methods_of.get(id(self)))
            try:
                next(inner)
            except StopIteration as done:
                return done.value
            yield

    monkeypatch.setattr(Engine, "_prefill_passes", logging_passes)
    out = tmp_path / "out"
    args = ["--batches", "2", "--temperatures", "0", "--workloads", "synthetic", "--repeats", "2"]
    args += ["--prompt-lens", "24", "--prefill-chunk", "8"]  # 2 rows of 4 positions
    methods = ["--methods", "plain,draft-auto", "--interleave", "steps"]
    assert _bench(model_dir, out, *args, *methods) == 0
    timed = [m for m in passed if m is not None][-12:]  # the last turn: 6 passes each
    assert sorted(timed) == ["draft-auto"] * 6 + ["plain"] * 6
    # each round of turns goes one method later: at most two passes of one in a row
    # (whole admissions in turn would give six)
    assert all(len(set(timed[i : i + 3])) == 2 for i in range(len(timed) - 2)), timed
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["prefill_chunk"] == 8
    rows = [r for r in data["rows"] if r["status"] == "ok"]
    assert len(rows) == 2 and rows[1]["same_output_as_plain"] == 1.0
    assert "--prefill-chunk 8" in (out / "summary.md").read_text()


def test_suffix_methods_run_and_match_plain(model_dir, tmp_path):
    """suffix-kN and suffix-auto are our engines with a suffix drafter (a store per run):
    rows measured, the same output as plain."""
    out = tmp_path / "out"
    args = ["--batches", "1", "--temperatures", "0", "--workloads", "code", "--repeats", "2"]
    assert _bench(model_dir, out, *args, "--methods", "plain,suffix-k4,suffix-auto") == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["plain", "suffix-k4", "suffix-auto"]
    assert all(r["status"] == "ok" for r in rows)
    assert all(r["same_output_as_plain"] == 1.0 for r in rows[1:])


def test_edits_workload_edits_the_same_files_in_turn():
    from specdec.bench import edits
    from specdec.bench.plan import Preset, build_points

    texts = edits.edit_texts(7)
    names = [next(name for _, name, _ in edits.FILES if name in t) for t in texts]
    assert names == ["lru_cache.py", "account.py", "word_count.py"] * 2 + ["lru_cache.py"]
    for text, name in zip(texts, names, strict=True):
        code = next(c for _, n, c in edits.FILES if n == name)
        assert f"```python\n{code}```" in text  # the whole file, quoted
    assert texts[0].split("\n")[0] != texts[3].split("\n")[0]  # the same file, a new edit
    preset = Preset(
        model="m", draft="d", workloads=("edits",), prompt_lens=(64,), batches=(1,),
        temperatures=(0.0,), methods=("plain", "suffix-auto", "suffix-k16", "ngram-k8"),
        max_tokens=8, prompts_per_point=6, curve_ks=(0,), repeats=1,
    )  # fmt: skip
    points = build_points(preset)
    assert [(p.workload, p.prompt_len, p.window) for p in points] == [
        ("edits", None, None), ("edits", None, "auto"), ("edits", None, 16), ("edits", None, 8)
    ]  # fmt: skip


def test_a_methods_peak_is_read_apart_from_earlier_ones():
    """After a reset the peak is today's RSS, not an earlier method's larger one."""
    import torch

    from specdec.bench.memory import peak_rss_bytes, reset_peak

    big = torch.ones(300 * 2**20, dtype=torch.uint8)  # 300 MB, touched
    high = peak_rss_bytes()
    del big
    reset_peak()
    after = peak_rss_bytes()
    assert high > 300e6
    if os.path.exists("/proc/self/clear_refs"):  # Linux: the reset takes
        assert after < high - 200e6
