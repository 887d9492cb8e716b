"""Learning while serving, on a tiny target: the engine's traffic reaches the buffer exactly,
heads trained on a repeated stream draft better (fails if learning is a no-op), swaps
mid-stream keep greedy output identical to plain, a trainer crash leaves serving on the
last good heads, and a checkpoint resumes."""

import time

import pytest
import torch

from specdec.acceptors import GreedyAcceptor
from specdec.drafters import SpeculatorDrafter
from specdec.engine import Engine
from specdec.errors import InvalidParameterError
from specdec.heads import build_speculator, load_speculator
from specdec.params import SamplingParams
from specdec.training.online import LearnConfig, OnlineLearner, TrafficBuffer
from specdec.training.target import TargetStates
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 9, 12, 80, 81, 2, 44], [33, 34], [7, 7, 8, 7, 7, 8, 7]]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2"))


@pytest.fixture(scope="module")
def plain(target, tokenizer):
    return Engine(target, tokenizer, frozenset(), max_batch=4).generate(PROMPTS, GREEDY)


def _engine(target, tokenizer, learner, max_batch=4):
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda b, length: SpeculatorDrafter(learner.current, b, learner=learner),
        acceptor=GreedyAcceptor(),
        window=FixedWindow(3),
    )


def _heads(target, **options):
    torch.manual_seed(0)
    return build_speculator(target, n_predict=3, **options).eval().requires_grad_(False)


def test_buffer_is_bounded_and_samples_windows():
    buffer = TrafficBuffer(max_tokens=20)
    for n in (8, 8, 8):
        buffer.add(torch.arange(n), torch.randn(n - 1, 4))
    assert buffer.tokens == 16 and len(buffer) == 2 and buffer.requests == 3  # oldest left
    import random

    hidden, tokens, valid = buffer.sample(5, 6, random.Random(0))
    assert hidden.shape == (5, 6, 4) and tokens.shape == valid.shape == (5, 6)
    assert bool(valid.all())  # 6-token windows of 8-token segments


def test_engine_hands_each_finished_request_exactly(target, tokenizer, plain):
    """Tokens: prompt + output; states: the target's own at each position but the last."""
    learner = OnlineLearner(_heads(target), LearnConfig(min_tokens=10**9))
    outs = _engine(target, tokenizer, learner, max_batch=2).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [p.token_ids for p in plain]  # lossless, untrained
    segments = {tuple(t.tolist()): h for t, h in learner.buffer.segments}
    states = TargetStates(target)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        seq = prompt + out.token_ids
        assert tuple(seq) in segments
        want = states(torch.tensor([seq]))[0, :-1]  # [S - 1, E]
        torch.testing.assert_close(segments[tuple(seq)], want, rtol=1e-4, atol=1e-4)
    metrics = learner.metrics()
    assert metrics["buffer_requests"] == len(PROMPTS) and metrics["version"] == 0
    assert len(metrics["acceptance_per_head"]) == 3


AUTOCAST = pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16 autocast"])


@AUTOCAST
@pytest.mark.parametrize("own_tables", [False, True], ids=["target tables", "own tables"])
def test_heads_improve_on_a_repeated_stream(target, tokenizer, plain, own_tables, autocast):
    """From untrained heads: after training on the traffic, the same requests take fewer
    target passes and the loss has fallen, in fp32 and under bf16 autocast. A no-op
    learner keeps the untrained figures."""
    options = dict(reuse_target=False, inner_dim=64) if own_tables else {}
    cfg = LearnConfig(
        min_tokens=32, batch_size=8, seq_len=24, lr=3e-3, publish_every=10, autocast=autocast
    )
    learner = OnlineLearner(_heads(target, **options), cfg)
    engine = _engine(target, tokenizer, learner)
    before = engine.generate(PROMPTS, GREEDY)
    passes_before = sum(o.stats.steps for o in before)
    first_loss = None
    for _ in range(12):
        assert learner.train_steps(10) == 10
        first_loss = first_loss if first_loss is not None else learner.loss
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
    passes_after = sum(o.stats.steps for o in outs)
    assert learner.version == 12 and learner.loss < 0.5 * first_loss
    assert passes_after < 0.7 * passes_before, (passes_before, passes_after)
    metrics = learner.metrics()
    assert metrics["mean_accepted_length"] > 1.3 and metrics["acceptance_per_head"][0] > 0.5


def test_the_rate_warms_up_and_defaults_by_kind(target, tokenizer):
    """The rate rises linearly over `warmup_steps` optimizer steps to 1e-3 for MLP heads
    and EAGLE_LR for an eagle head (or the configured rate), and the optimizer steps with
    it; a resumed learner goes on at the rate of its step."""
    from specdec.training.online import EAGLE_LR, MLP_LR

    learner = OnlineLearner(_heads(target), LearnConfig(min_tokens=8, seq_len=8, batch_size=2))
    assert learner.lr == MLP_LR
    assert [learner.rate(s) for s in (0, 9, 19, 50)] == pytest.approx(
        [MLP_LR / 20, MLP_LR / 2, MLP_LR, MLP_LR]
    )
    eagle = _eagle_learner(target, LearnConfig(warmup_steps=0))
    assert eagle.lr == EAGLE_LR and eagle.rate(0) == EAGLE_LR
    assert _eagle_learner(target, LearnConfig(lr=5e-5)).rate(10**6) == 5e-5
    engine = _engine(target, tokenizer, learner)
    engine.generate(PROMPTS, GREEDY)
    assert learner.train_steps(3) == 3
    assert learner.opt.param_groups[0]["lr"] == pytest.approx(learner.rate(learner.steps - 1))
    with pytest.raises(InvalidParameterError, match="lr"):
        LearnConfig(lr=0)


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_swaps_mid_stream_keep_greedy_output_plain(target, tokenizer, plain):
    """Budget 1: a micro-batch after every engine step, new heads every optimizer step."""
    cfg = LearnConfig(
        min_tokens=16, seq_len=16, batch_size=4, micro_batch=2, publish_every=1, budget=1.0
    )
    learner = OnlineLearner(_heads(target, reuse_target=False, inner_dim=32), cfg)
    engine = _engine(target, tokenizer, learner)
    engine.generate(PROMPTS, GREEDY)  # traffic to learn from
    versions = set()
    for _ in range(4):
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
        versions.add(learner.version)
    assert len(versions) > 1 and learner.version >= 3  # swapped between and during them
    learner.close()
    assert learner.error is None and not learner.training


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _timed_learner(target, budget: float, micro_s: float) -> tuple[OnlineLearner, FakeClock]:
    """A learner with traffic whose micro-batches take `micro_s` on a fake clock."""
    cfg = LearnConfig(min_tokens=8, seq_len=8, batch_size=4, micro_batch=1, budget=budget)
    learner = OnlineLearner(_heads(target), cfg)
    learner.record_request(torch.arange(40), torch.randn(39, 64))
    clock = FakeClock()
    learner._clock, learner._tick = clock, 0.0
    real_step = learner._micro_step

    def timed_step():
        clock.now += micro_s
        return real_step()

    learner._micro_step = timed_step
    return learner, clock


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5])
def test_training_takes_at_most_its_budget_of_wall_time(target, budget):
    """Steps of 50 ms, micro-batches of 300 ms: training's share of wall time stays at the
    budget (a scheduler that trained after every step would take 86%) and no step waits
    for more than one micro-batch."""
    learner, clock = _timed_learner(target, budget, micro_s=0.3)
    waits = []
    for _ in range(600):
        clock.now += 0.05  # an engine step
        before = clock.now
        learner.between_steps()
        waits.append(clock.now - before)
    share = learner.train_s / clock.now
    assert budget - 0.03 <= share <= budget + 1e-9, share
    assert max(waits) == pytest.approx(0.3) and learner.steps > 0


def test_a_stalled_micro_batch_does_not_starve_training(target):
    """A micro-batch that took 600 s (the process was paused mid-batch) counts as a few
    estimates: training resumes at its budget soon after, instead of waiting for the
    serving time that 600 s would earn (1,800 s at a 0.25 budget)."""
    learner, clock = _timed_learner(target, 0.25, micro_s=0.3)
    for _ in range(100):
        clock.now += 0.05
        learner.between_steps()
    real_step = learner._micro_step
    stalled = {"once": True}

    def maybe_stalled():
        if stalled.pop("once", False):
            clock.now += 600.0
        return real_step()

    learner._micro_step = maybe_stalled
    while stalled:
        clock.now += 0.05
        learner.between_steps()
    steps = learner.steps
    for _ in range(400):  # 20 s of serving
        clock.now += 0.05
        learner.between_steps()
    assert learner.steps > steps
    assert learner._micro_s < 2.0


def test_budget_one_trains_after_every_step(target):
    learner, clock = _timed_learner(target, 1.0, micro_s=0.3)
    assert all(learner.between_steps() for _ in range(8)) and learner.steps == 2


def test_idle_time_goes_through_the_new_traffic_about_once(target):
    """While idle a micro-batch (8 tokens here) runs per call until the 40 new tokens are
    gone through; then idle calls do nothing until more traffic arrives."""
    learner, _ = _timed_learner(target, 0.25, micro_s=0.3)
    trained = [learner.between_steps(idle=True) for _ in range(8)]
    assert trained == [True] * 5 + [False] * 3
    learner.record_request(torch.arange(16), torch.randn(15, 64))
    assert [learner.between_steps(idle=True) for _ in range(3)] == [True, True, False]


def test_a_trainer_crash_is_reported_and_serving_goes_on(target, tokenizer, plain, caplog):
    cfg = LearnConfig(
        min_tokens=16, seq_len=16, batch_size=4, micro_batch=4, publish_every=1, budget=1.0
    )
    learner = OnlineLearner(_heads(target), cfg)
    engine = _engine(target, tokenizer, learner)
    engine.generate(PROMPTS, GREEDY)
    real_step = learner._micro_step

    def failing_step():
        if learner.version >= 2:
            raise RuntimeError("out of memory (simulated)")
        return real_step()

    learner._micro_step = failing_step
    outs = engine.generate(PROMPTS, GREEDY)  # the crash comes between two of its steps
    assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
    assert learner.error == "RuntimeError: out of memory (simulated)"
    assert "heads trainer failed" in caplog.text
    good = learner.current
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
    assert learner.current is good and learner.version == 2 and not learner.between_steps()
    metrics = learner.metrics()
    assert metrics["error"].startswith("RuntimeError") and metrics["training"] is False
    learner.close()  # no publish after a failure; still closes cleanly


def test_checkpoint_to_the_heads_dir_and_resume(target, tokenizer, tmp_path):
    heads = _heads(target)
    heads.save(tmp_path)
    cfg = LearnConfig(min_tokens=16, seq_len=16, batch_size=4, publish_every=3)
    learner = OnlineLearner(load_speculator(tmp_path, target), cfg, out=tmp_path)
    _engine(target, tokenizer, learner).generate(PROMPTS, GREEDY)
    learner.train_steps(7)
    learner.close()  # publishes the last steps too
    assert learner.version == 3
    reloaded = load_speculator(tmp_path, target)
    hidden, last = torch.randn(3, 64), torch.tensor([1, 2, 3])
    assert torch.equal(
        reloaded.propose_greedy(hidden, last, 3), learner.current.propose_greedy(hidden, last, 3)
    )
    resumed = OnlineLearner(reloaded, cfg, out=tmp_path)
    assert (resumed.version, resumed.steps) == (3, 7)
    assert resumed.opt.state_dict()["state"]  # the optimizer's moments came back
    assert not (tmp_path / ".learn-tmp").exists()


def test_server_reports_the_learner(target, tokenizer):
    """/metrics and usage.speculation carry the heads' version, buffer, loss, acceptance."""
    from fastapi.testclient import TestClient

    from specdec.serving.app import build_app

    cfg = LearnConfig(min_tokens=8, seq_len=8, batch_size=2, micro_batch=1, publish_every=1)
    learner = OnlineLearner(_heads(target), cfg)
    engine = _engine(target, tokenizer, learner)
    app = build_app(engine, "tiny", learner=learner)
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 12, "temperature": 0}
    with TestClient(app) as client:
        client.post("/v1/completions", json={**body, "ignore_eos": True})
        assert _wait_for(lambda: learner.version >= 1)  # the idle server trains
        usage = client.post("/v1/completions", json=body).json()["usage"]
        text = client.get("/metrics").text
    heads = usage["speculation"]["heads"]
    assert heads["version"] >= 1 and heads["buffer_requests"] >= 1 and heads["loss"] > 0
    assert len(heads["acceptance_per_head"]) == 3 and heads["error"] is None
    for name in ("version", "buffer_tokens", "loss", "acceptance", "trainer_failed"):
        assert f"specdec_heads_{name}" in text, name
    version = next(line for line in text.splitlines() if line.startswith("specdec_heads_version "))
    assert float(version.split()[1]) >= heads["version"]  # an idle server may train on


def test_cli_learns_from_untrained_heads_and_resumes(tmp_path, capsys):
    from specdec.cli import main

    from tiny import tiny_tokenizer

    model = tmp_path / "model"
    hf_tiny("qwen2").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    heads = tmp_path / "heads"  # does not exist yet: untrained heads start there
    argv = ["generate", "--model", str(model), "--dtype", "fp32", "--draft", str(heads)]
    argv += ["--learn", "--learn-budget", "0.5", "--max-tokens", "8", "--ignore-eos", "abc"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "specdec: heads {" in err and (heads / "config.json").is_file()
    assert (heads / "learn_state.json").is_file()
    assert main(argv) == 0  # again on the same directory: it loads and resumes
    assert (heads / "model.safetensors").is_file()
    capsys.readouterr()
    assert main([*argv[:-1], "--learn-lr", "0", argv[-1]]) == 2
    assert "lr must be > 0, got 0.0" in capsys.readouterr().err


def test_cli_learn_lr_reaches_the_learner(tmp_path):
    """`--learn-lr` sets the learner's rate; left out, the learner picks by head kind."""
    from specdec.cli import build_parser
    from specdec.engine_args import EngineArgs

    base = ["generate", "--model", "m", "--draft", str(tmp_path / "new"), "--learn", "p"]
    assert EngineArgs.from_cli_args(build_parser().parse_args(base)).learn_lr is None
    given = build_parser().parse_args([*base[:-1], "--learn-lr", "3e-5", "p"])
    assert EngineArgs.from_cli_args(given).learn_lr == 3e-5


def _eagle_learner(target, cfg, out=None):
    """An untrained eagle head (trained in fp32, served as a fused copy) and its learner."""
    from specdec.heads.eagle import build_eagle

    torch.manual_seed(0)
    head = build_eagle(target, intermediate_size=64, n_predict=3).eval().requires_grad_(False)

    def serve(trainable):
        return trainable.for_drafting("none")

    return OnlineLearner(head, cfg, out=out, serve=serve)


def _eagle_engine(target, tokenizer, learner, max_batch=4):
    from specdec.drafters import EagleDrafter

    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda b, n: EagleDrafter(learner.current, b, n, learner=learner),
        acceptor=GreedyAcceptor(),
        window=FixedWindow(3),
    )


@AUTOCAST
def test_an_eagle_head_learns_and_resumes(target, tokenizer, plain, tmp_path, autocast):
    """An eagle head learns from the traffic alone (its own objective: states and tokens
    over unrolled draft steps), in fp32 and under bf16 autocast: the same requests take
    fewer target passes, output stays plain greedy's through the swaps, the served form is
    the drafting one, and a checkpoint holds the trainable form, which a new learner
    resumes from."""
    from specdec.heads.eagle import load_eagle

    cfg = LearnConfig(
        min_tokens=32, batch_size=8, seq_len=24, lr=3e-3, publish_every=10, autocast=autocast
    )
    learner = _eagle_learner(target, cfg, out=tmp_path)
    engine = _eagle_engine(target, tokenizer, learner, max_batch=2)
    before = engine.generate(PROMPTS, GREEDY)
    passes_before = sum(o.stats.steps for o in before)
    first_loss = None
    for _ in range(10):
        assert learner.train_steps(10) == 10
        first_loss = first_loss if first_loss is not None else learner.loss
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
    passes_after = sum(o.stats.steps for o in outs)
    assert learner.version == 10 and learner.loss < 0.95 * first_loss  # (0.89 seen)
    assert passes_after < 0.8 * passes_before, (passes_before, passes_after)  # 37 -> 25 seen
    assert learner.current.qkv_proj is not None and learner.published.q is not None
    learner.close()
    saved = load_eagle(tmp_path, target)
    for name, value in learner.published.state_dict().items():
        torch.testing.assert_close(saved.state_dict()[name], value)
    again = _eagle_learner(target, cfg, out=tmp_path)
    assert again.steps == learner.steps and again.version == learner.version


def test_an_eagle_learner_swapping_every_step_keeps_greedy_output_plain(target, tokenizer, plain):
    cfg = LearnConfig(
        min_tokens=16, seq_len=16, batch_size=4, micro_batch=2, publish_every=1, budget=1.0
    )
    learner = _eagle_learner(target, cfg)
    engine = _eagle_engine(target, tokenizer, learner)
    engine.generate(PROMPTS, GREEDY)
    versions = set()
    for _ in range(3):
        outs = engine.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
        versions.add(learner.version)
    assert len(versions) > 1 and learner.error is None


def test_cli_learns_with_an_eagle_head(tmp_path, capsys):
    """`--draft EAGLE_DIR --learn`: the head learns while generating, checkpoints its
    trainable form into the directory, and a second run loads it and resumes."""
    from specdec.cli import main
    from specdec.heads.eagle import build_eagle, load_eagle
    from specdec.models.loading import load_transformer

    from tiny import tiny_tokenizer

    model = tmp_path / "model"
    hf_tiny("qwen2").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    target = load_transformer(model, "fp32")
    build_eagle(target, intermediate_size=32, n_predict=2).save(tmp_path / "eagle")
    argv = [
        "generate",
        "--model",
        str(model),
        "--dtype",
        "fp32",
        "--draft",
        str(tmp_path / "eagle"),
    ]
    argv += ["--learn", "--learn-budget", "1", "--max-tokens", "40", "--ignore-eos", "abcabc"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "specdec: heads {" in err and (tmp_path / "eagle" / "learn_state.json").is_file()
    load_eagle(tmp_path / "eagle", target)  # a whole head, in its trainable form
    assert main(argv) == 0
