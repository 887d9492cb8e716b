"""Tensor parallelism with 2 gloo processes on CPU against the single-process engine.

The ranks run `tp_worker.py`: one torchrun launch computes every equivalence check
(`scenarios`), and three failure launches run side by side (rank 1 raises, dies, hangs).
Each launch has a hard timeout; a launch that outlives it is killed and the test fails.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specdec.cli import main
from specdec.distributed import check_divisible, init_tensor_parallel, sharding
from specdec.errors import InvalidParameterError, UnsupportedModelError
from specdec.models.config import ModelConfig

from tiny import hf_tiny, tiny_tokenizer

WORKER = Path(__file__).with_name("tp_worker.py")
ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 180
HANG_TIMEOUT_S = 8  # the group timeout in the hang scenario


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str, **env) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.Popen(
        [*cmd, str(WORKER), *args],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # killpg reaches the workers too
    )


def _pair(*args: str, **env) -> list[subprocess.Popen]:
    """Two ranks started directly with torchrun's environment variables."""
    port = str(_free_port())
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            env=_env(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE="2",
                **env,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]


def _finish(proc: subprocess.Popen, deadline: float) -> tuple[int, str]:
    """Exit status and output; a process past the deadline is killed and the test fails."""
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"a rank hung past the test's timeout; output:\n{out[-3000:]}")


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


# -- equivalence ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2-tp")
    hf_tiny("qwen2").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    _worker().save_speculators(str(path))  # MODEL_DIR/speculators/NAME
    return path


def _worker():
    sys.path.insert(0, str(WORKER.parent))
    import tp_worker

    return tp_worker


@pytest.fixture(scope="module")
def launches(tmp_path_factory, model_dir):
    """Every launch at once (they mostly wait on each other): the equivalence run, and
    the three failure runs, rank 1 raising (under torchrun), dying, hanging.

    Returns {name: (rank 0's results, exit status of torchrun or rank 0, output)}.
    """
    tmp = tmp_path_factory.mktemp("tp")
    running = {
        "equivalence": _pair("equivalence", str(tmp / "equivalence.pt"), str(model_dir)),
        "raise": [_torchrun("raise", str(tmp / "raise.json"))],
        "exit": _pair("exit", str(tmp / "exit.json")),
        "hang": _pair("hang", str(tmp / "hang.json"), TEST_TP_TIMEOUT=str(HANG_TIMEOUT_S)),
    }
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    results = {}
    try:
        for name, procs in running.items():
            code, out = _finish(procs[0], deadline)  # torchrun, or rank 0
            path = next(tmp.glob(f"{name}.*"), None)
            assert path, f"{name}: rank 0 wrote no results (exit {code}):\n{out[-3000:]}"
            data = torch.load(path) if path.suffix == ".pt" else json.loads(path.read_text())
            results[name] = (data, code, out)
    finally:
        for procs in running.values():
            for proc in procs[1:]:
                # rank 1 of "hang" sleeps on: torchrun would stop it once rank 0 exited
                _kill(proc)
    return results


@pytest.fixture(scope="module")
def tp_results(launches):
    data, code, out = launches["equivalence"]
    assert code == 0, out[-5000:]
    return data


@pytest.fixture(scope="module")
def failures(launches):
    return launches


@pytest.fixture(scope="module")
def reference(model_dir):
    torch.set_num_threads(1)
    return _worker().scenarios(None, str(model_dir))


def test_logits_equal_single_process(tp_results, reference):
    names = [k for k in reference if k.startswith("logits/")]
    assert len(names) == 2
    for name in names:
        for phase, expected in reference[name].items():
            got = tp_results[name][phase]
            assert got.shape == expected.shape, (name, phase)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=f"{name} {phase}")


def test_all_reduce_adds_row_by_row_whatever_the_layouts(tp_results, reference):
    got, expected = tp_results["all_reduce/mixed-layouts"], reference["all_reduce/mixed-layouts"]
    assert torch.equal(got, expected)


@pytest.mark.parametrize("case", ["plain", "draft", "draft-sharded", "ngram", "auto"])
def test_greedy_outputs_token_identical(tp_results, reference, case):
    assert tp_results[f"greedy/{case}"] == reference[f"greedy/{case}"]


@pytest.mark.parametrize("case", ["plain", "draft", "draft-sharded"])
def test_sampled_outputs_identical_for_the_same_seed(tp_results, reference, case):
    assert tp_results[f"sampled/{case}"] == reference[f"sampled/{case}"]


def test_ranks_agree_and_only_rank0_prints(tp_results, reference):
    # Every result, unseeded sampling included (rank 0 drew the seeds), is the same on both
    # ranks; the CLI printed on rank 0 only, the same completions as one process.
    assert tp_results["ranks_agree"]
    assert tp_results["cli_rank1"] == []
    assert tp_results["cli"] == reference["cli"] and len(reference["cli"]) == 2


# -- speculator heads ------------------------------------------------------------------------


@pytest.mark.parametrize("drafting", ["chain", "tree"])
@pytest.mark.parametrize("tables", ["target-tables", "own-tables"])
def test_speculator_heads_draft_as_in_one_process(tp_results, reference, tables, drafting):
    """Saved heads loaded by `LLM(..., tp=2)`: the same greedy output as one process (and
    as plain decoding), the same steps, and every proposal the same (the heads read the
    whole hidden state and, reusing the target's, the whole vocabulary head). Random heads
    are seldom right: the scripted test below has every draft accepted."""
    got, want = (r[f"speculator/{tables}/{drafting}"] for r in (tp_results, reference))
    assert got["tokens"] == want["tokens"] == reference["greedy/plain"]
    assert got["steps"] == want["steps"] and got["accepted"] == want["accepted"]
    assert len(got["proposals"]) == len(want["proposals"]) > 0
    for a, b in zip(got["proposals"], want["proposals"], strict=True):
        assert torch.equal(a, b)


def test_scripted_tree_heads_under_tp(tp_results, reference):
    """Tree verification through the sharded attention: the true continuation second at
    every level, all accepted each step (N - 1 tokens after the first, HEADS + 1 a pass)."""
    from equivalence.test_speculator_tree import HEADS

    run = tp_results["speculator/scripted-tree"]
    assert run["tokens"] == run["refs"] == reference["greedy/plain"]
    steps = math.ceil((_worker().N - 1) / (HEADS + 1))
    assert run["steps"] == [steps] * len(run["tokens"]) and run["calls"] > 0


# -- failures --------------------------------------------------------------------------------


def test_a_rank_that_raises_is_named_on_rank0(failures):
    report, code, out = failures["raise"]
    assert code != 0  # torchrun: a worker failed
    assert report["type"] == "DistributedError"
    assert "rank 1 failed: ValueError: injected failure on rank 1" in report["message"]
    assert report["seconds"] < 60  # at once, not after the 120 s group timeout
    assert "DistributedError: tensor parallelism: rank 1 failed" in out


def test_a_killed_rank_is_reported_at_once(failures):
    report, code, _ = failures["exit"]
    assert code == 2
    assert "lost contact with rank(s) [1]" in report["message"]
    assert "reset by peer" in report["message"] or "closed by peer" in report["message"]
    assert report["seconds"] < 60  # from rank 0's forward that rank 1 never joined


def test_a_hung_rank_is_reported_after_the_timeout(failures):
    report, code, _ = failures["hang"]
    assert code == 2
    assert f"hung longer than the {HANG_TIMEOUT_S} s collective timeout" in report["message"]
    assert HANG_TIMEOUT_S <= report["seconds"] < 60


# -- refused before loading ------------------------------------------------------------------


def test_tp_must_match_the_number_of_processes(monkeypatch, model_dir, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(InvalidParameterError, match="needs exactly 2 processes.*single process"):
        init_tensor_parallel(2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(InvalidParameterError, match="WORLD_SIZE=4"):
        init_tensor_parallel(2)
    code = main(["generate", "--model", str(model_dir), "--tp", "2", "hi"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "torchrun --nproc-per-node 2" in err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InvalidParameterError, match="WORLD_SIZE=2"):
        init_tensor_parallel(1)


def test_tp_that_does_not_divide_the_heads_is_refused_before_loading(monkeypatch, model_dir):
    cfg = ModelConfig.from_dir(model_dir)  # 4 heads, 2 kv heads, MLP 128
    check_divisible(cfg, 2)
    with pytest.raises(UnsupportedModelError, match="num_attention_heads = 4"):
        check_divisible(cfg, 3)
    with pytest.raises(UnsupportedModelError, match="num_key_value_heads = 2"):
        check_divisible(cfg, 4)

    class FakeGroup:  # three ranks, as torchrun would start them
        rank, world_size, device = 0, 3, torch.device("cpu")

        def fail(self, err):
            return err

    def no_weights(*args):
        raise AssertionError("weights were read")

    import specdec.llm
    from specdec.models import loading

    monkeypatch.setattr(specdec.llm, "init_tensor_parallel", lambda tp, device: FakeGroup())
    monkeypatch.setattr(loading, "read_safetensors", no_weights)
    monkeypatch.setattr(sharding, "read_safetensors", no_weights)
    with pytest.raises(UnsupportedModelError, match="tensor parallelism 3 must divide"):
        specdec.llm.LLM(str(model_dir), dtype="fp32", tp=3)
    with pytest.raises(UnsupportedModelError, match="num_attention_heads"):
        sharding.load_shard(model_dir, "fp32", FakeGroup())


def test_vocab_shards_are_padded_rows_of_the_head():
    head = torch.arange(5 * 2, dtype=torch.float32).view(5, 2)
    parts = [sharding._vocab_slice(head, r, 2) for r in (0, 1)]
    assert [p.shape for p in parts] == [(3, 2), (3, 2)]
    assert torch.equal(torch.cat(parts)[:5], head) and parts[1][2].abs().sum() == 0


def test_speculator_heads_are_not_sharded(monkeypatch, model_dir):
    """Heads are replicated: --draft-tp N with a speculator directory is refused."""
    import specdec.llm

    class FakeGroup:  # two ranks; a failure is raised as it is
        def fail(self, err):
            return err

    monkeypatch.setattr(specdec.llm, "init_tensor_parallel", lambda tp, device: FakeGroup())
    spec = str(model_dir / "speculators" / "target-tables")
    with pytest.raises(InvalidParameterError, match="use --draft-tp 1"):
        specdec.llm.LLM(str(model_dir), draft=spec, dtype="fp32", tp=2, draft_tp=2)
