"""scripts/bench_learn.py's report (the learning curve and the learner's cost) on
request logs written here: tokens per target pass per window, decode tokens/s, and the
learner-on (frozen) over learner-off ratio on the requests both replayed."""

import json
from pathlib import Path


def _row(i, steps, accepted, wall, generated=9, ttft=0.5, version=0, loss=None):
    return dict(
        request=i,
        doc=i,
        prompt_tokens=10,
        generated=generated,
        steps=steps,
        accepted=accepted,
        drafted=3 * steps,
        wall_s=wall,
        ttft_s=ttft,
        heads_version=version,
        learner_steps=0,
        loss=loss,
        error=None,
    )


def _write(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_windows_and_learning_cost(tmp_path, script):
    bench = script("bench_learn")
    # learn: the first window keeps nothing (8 passes for 8 tokens), the second keeps half
    _write(
        tmp_path / "requests-learn.jsonl",
        [_row(i, 8, 0, 2.5) for i in range(2)]
        + [_row(i, 4, 4, 1.5, version=3, loss=2.0) for i in range(2, 4)],
    )
    # frozen took 25% longer per decode token than off on the requests both replayed
    _write(tmp_path / "requests-frozen.jsonl", [_row(i, 8, 0, 0.5 + 2.5) for i in range(3)])
    _write(tmp_path / "requests-off.jsonl", [_row(i, 8, 0, 0.5 + 2.0) for i in range(2)])
    bench.main(["--out", str(tmp_path), "--report", "--window", "2"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    learn = summary["modes"]["learn"]
    assert [w["tokens_per_pass"] for w in learn["windows"]] == [1.0, 2.0]
    assert [w["decode_tok_s"] for w in learn["windows"]] == [4.0, 8.0]
    assert learn["windows"][1]["heads_version"] == 3 and learn["windows"][1]["loss"] == 2.0
    assert learn["tokens_per_pass"] == round(1 + 8 / 24, 4)
    cost = summary["learning_cost"]
    assert cost["requests"] == 2 and cost["ratio"] == 0.8
    assert (tmp_path / "learning.png").stat().st_size > 0


def test_a_resumed_replay_skips_what_is_logged(tmp_path, script):
    bench = script("bench_learn")
    _write(tmp_path / "requests-learn.jsonl", [_row(i, 4, 1, 1.0) for i in (0, 1, 3)])
    assert bench._done(tmp_path / "requests-learn.jsonl") == {0, 1, 3}
    assert bench._done(tmp_path / "missing.jsonl") == set()


def test_in_process_cost_summary(tmp_path, script):
    """--mode cost logs each request's wall time on the three engines; the report gives
    the throughput ratios over summed wall time and training's share of it."""
    bench = script("bench_learn")
    walls = [{"off": 2.0, "record": 2.1, "train": 2.5}, {"off": 2.0, "record": 2.1, "train": 2.5}]
    rows = [
        dict(request=i, doc=i, prompt_tokens=9, generated=8, same_length=True, wall_s=w,
             train_s=0.5, learner_steps=i)
        for i, w in enumerate(walls)
    ]  # fmt: skip
    _write(tmp_path / "requests-cost.jsonl", rows)
    bench.main(["--out", str(tmp_path), "--report"])
    cost = json.loads((tmp_path / "summary.json").read_text())["learning_cost_in_process"]
    assert cost["requests"] == 2 and cost["generated"] == 16
    assert cost["throughput_record_over_off"] == round(2 / 2.1, 4)
    assert cost["throughput_train_over_off"] == 0.8 and cost["train_share_of_wall"] == 0.2
