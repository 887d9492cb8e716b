"""`specdec bench --tp 2` under torchrun with 2 gloo ranks on a tiny fp32 model: rank 0
writes the folder with tp = 2 recorded, peers are skipped with the reason, the outputs are
those of the same sweep in one process, and only rank 0 printed. Plus the store hand-over
(rank 0's rows and errors on every rank) without a launch."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.bench import cli as bench_cli
from specdec.bench.results import ResultStore
from specdec.cli import main
from specdec.errors import InvalidParameterError

from tiny import hf_tiny, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 240
ENGINE_METHODS = "plain,draft-k2,draft-auto,ngram-auto"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-tp-bench")
    hf_tiny("qwen2").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _args(model_dir, out, methods: str) -> list[str]:
    return [
        "bench",
        "--model", str(model_dir),
        "--draft", str(model_dir),
        "--dtype", "fp32",
        "--draft-quant", "none",
        "--workloads", "code",
        "--batches", "1",
        "--temperatures", "0,1",
        "--methods", methods,
        "--max-tokens", "6",
        "--prompts-per-point", "2",
        "--curve-ks", "0,1,2",
        "--threads", "1",
        "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tp_run(model_dir, tmp_path_factory):
    """One torchrun launch of the sweep (rank 0's folder and the launch's whole output)."""
    out = tmp_path_factory.mktemp("tp-bench-out")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "specdec.cli", *_args(model_dir, out, ENGINE_METHODS + ",hf-generate")]
    done = subprocess.run(
        [*cmd, "--tp", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    return out, output


@pytest.fixture(scope="module")
def one_process(model_dir, tmp_path_factory):
    """The same engine points in this process (no peers: transformers is not compared)."""
    out = tmp_path_factory.mktemp("one-process-bench-out")
    assert main(_args(model_dir, out, ENGINE_METHODS)) == 0
    return json.loads((out / "results.json").read_text())


def test_rank0_writes_the_folder_with_tp_recorded(tp_run):
    out, output = tp_run
    for name in ("results.json", "results.csv", "summary.md", "tokens_per_s.png"):
        assert (out / name).is_file(), name
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["tp"] == 2 and data["config"]["draft_tp"] == 1
    assert data["command"].startswith("torchrun --nproc-per-node 2 -m specdec.cli bench --tp 2")
    assert "tensor parallel: 2 processes (gloo)" in data["machine"]
    rows = {r["key"]: r for r in data["rows"]}
    assert len(rows) == 2 * 5 and all(r["tp"] == 2 for r in rows.values())
    with (out / "results.csv").open() as f:
        assert {line["tp"] for line in csv.DictReader(f)} == {"2"}
    summary = (out / "summary.md").read_text()
    assert "**Tensor parallel:** tp = 2 ranks" in summary
    # One rank printed: the start line, the closing line.
    assert output.count("points to measure into") == 1
    assert output.count(" points in ") == 1


def test_peers_are_skipped_with_the_reason(tp_run):
    data = json.loads((tp_run[0] / "results.json").read_text())
    skipped = [r for r in data["rows"] if r["status"] == "skipped"]
    assert {r["method"] for r in skipped} == {"hf-generate"} and len(skipped) == 2
    assert all("not under tensor parallelism (--tp 2)" in r["reason"] for r in skipped)
    assert "not under tensor parallelism" in (tp_run[0] / "summary.md").read_text()


def test_numbers_are_sane_and_outputs_those_of_one_process(tp_run, one_process):
    data = json.loads((tp_run[0] / "results.json").read_text())
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert len(ok) == 2 * 4
    reference = {r["key"]: r for r in one_process["rows"]}
    for row in ok:
        assert row["tokens_per_s"] > 0 and row["generated_tokens"] > 0 and row["speedup"] > 0
        assert 0 < row["tpot_median_s"] <= row["tpot_p90_s"] and row["ttft_median_s"] > 0
        assert row["cpu_speedup"] is None  # CPU time misses the waits on collectives
        # Greedy, and seeded sampling with a fixed window: the tokens one process generates
        # (fp32). Sampling under `auto` draws as many numbers as its k, chosen from timings.
        if row["temperature"] == 0 or row["window"] != "auto":
            assert row["token_ids"] == reference[row["key"]]["token_ids"], row["key"]
        if row["temperature"] == 0:
            assert row["same_output_as_plain"] == 1.0, row["key"]
        if row["window"] == "auto" and not row["drafted_tokens"]:
            # A self-draft's catch-up costs a whole prefill: auto may rightly never start.
            assert row["acceptance_rate"] is None and row["mean_accepted_length"] == 1.0
        elif row["window"] is not None:
            assert 0 <= row["acceptance_rate"] <= 1 and row["predicted_speedup"] > 0
    # The draft is the target itself: always right.
    assert next(r for r in ok if r["method"] == "draft-k2")["acceptance_rate"] == 1.0
    costs = data["costs"]["code|len=natural|batch=1"]
    # Wall time under TP (a rank waiting on a collective uses no CPU), even with 1 thread.
    assert costs["clock"] == "wall"
    assert one_process["costs"]["code|len=natural|batch=1"]["clock"] == "cpu"
    assert set(costs["v"]) == {"0", "1", "2"} and costs["c"] > 0


# -- rank 0's store on every rank (no launch) ------------------------------------------------


class FakeGroup:
    """Rank 0 records what it broadcasts; a follower receives it."""

    def __init__(self, rank: int, sent: list) -> None:
        self.rank, self.sent = rank, sent

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def broadcast_object(self, obj=None):
        if self.is_leader:
            self.sent.append(obj)
            return obj
        return self.sent.pop(0)


def test_followers_resume_from_rank0s_store_and_write_nothing(tmp_path):
    config = {"model": "m", "tp": 2}
    leader_dir, follower_dir = tmp_path / "rank0", tmp_path / "rank1"
    first = ResultStore(leader_dir, config)
    first.add({"key": "a", "status": "ok"})
    first.add({"key": "b", "status": "skipped"})
    first.costs = {"c": {"rows": 1}}
    first.save()

    sent: list = []
    store = bench_cli._open_store(leader_dir, config, FakeGroup(0, sent))
    replica = bench_cli._open_store(follower_dir, config, FakeGroup(1, sent))
    # The follower's folder is empty (another machine): it resumes from rank 0's rows.
    assert replica.rows == store.rows and replica.costs == store.costs
    assert replica.done("a") and not replica.done("b")
    replica.add({"key": "c", "status": "ok"})
    replica.save()
    assert not follower_dir.exists()

    # Another configuration: rank 0's error on every rank, not a hang.
    other = {"model": "m", "tp": 2, "dtype": "fp32"}
    with pytest.raises(InvalidParameterError, match="another configuration"):
        bench_cli._open_store(leader_dir, other, FakeGroup(0, sent))
    with pytest.raises(InvalidParameterError, match="another configuration"):
        bench_cli._open_store(follower_dir, other, FakeGroup(1, sent))
