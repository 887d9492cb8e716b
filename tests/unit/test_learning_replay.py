"""Learning while serving from a mixed buffer, on a tiny target: windows come from the
heads directory's stored stage-2 data in their share, a trained head learning new traffic
with that data replayed keeps (and sharpens) what it learnt offline where traffic alone
wears it down, and an EAGLE-3 head learns from the target's auxiliary states with greedy
output unchanged."""

import json
import logging
import random

import pytest
import torch

from specdec.acceptors import GreedyAcceptor
from specdec.drafters import SpeculatorDrafter
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.engine import Engine
from specdec.heads import build_speculator
from specdec.heads.eagle3 import build_eagle3, load_eagle3
from specdec.params import SamplingParams
from specdec.training.online import LearnConfig, OnlineLearner, copy_heads
from specdec.training.segments import STAGE2, save_stage2_segments
from specdec.training.target import TargetStates
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf

OFFLINE = [[5, 17, 42, 8], [60, 3, 3, 9, 12, 80, 81, 2, 44], [33, 34], [7, 7, 8, 7, 7, 8, 7]]
TRAFFIC = [[90, 91, 15], [22, 23, 24, 25, 26], [70, 11, 70, 11], [50, 49, 48]]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
AUX = (1, 2, 3)  # the layers an EAGLE-3 head of the tiny 4-layer target reads


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2", num_hidden_layers=4))


def _engine(target, tokenizer, learner, drafter=SpeculatorDrafter):
    def make(max_batch, max_len):
        if drafter is SpeculatorDrafter:
            return SpeculatorDrafter(learner.current, max_batch, learner=learner)
        return drafter(learner.current, max_batch, max_len, learner=learner)

    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=4,
        drafter_factory=make,
        acceptor=GreedyAcceptor(),
        window=FixedWindow(3),
    )


def _passes(target, tokenizer, learner, prompts, drafter=SpeculatorDrafter):
    outs = _engine(target, tokenizer, learner, drafter).generate(prompts, GREEDY)
    return sum(o.stats.steps for o in outs), [o.token_ids for o in outs]


def _store(target, tokenizer, prompts, folder, aux_layers=()):
    """The trainer's stage-2 files for `prompts`: the target's greedy answers with its
    states (final, or with `aux_layers` those layers' inputs), in `folder/stage2/`."""
    outs = Engine(target, tokenizer, frozenset()).generate(prompts, GREEDY)
    states = TargetStates(target, aux_layers=aux_layers)
    segments = []
    for prompt, out in zip(prompts, outs, strict=True):
        seq = torch.tensor([prompt + out.token_ids])
        segments.append((seq[0, len(prompt) - 1 :], states(seq)[0, len(prompt) - 1 :]))
    (folder / STAGE2).mkdir(parents=True, exist_ok=True)
    save_stage2_segments(folder / STAGE2 / "chunk-00000.safetensors", segments)
    return folder


def _mlp_heads(target):
    torch.manual_seed(0)
    return build_speculator(target, n_predict=3).eval().requires_grad_(False)


CFG = dict(min_tokens=32, batch_size=8, seq_len=24, lr=3e-3, publish_every=10)


def _segments(ids, width):
    """One stored segment of `ids` with random states [S, E]."""
    tokens = torch.tensor(list(ids))
    return [(tokens, torch.randn(len(tokens), width))]


def test_windows_come_from_the_stored_data_in_their_share(target, tokenizer, tmp_path):
    """Stored windows hold only stored tokens (ids >= 100 here), the traffic's only its
    own; about `replay_share` of them are stored; share 0 or no files: traffic only."""
    store = _segments(range(100, 140), width=target.config.hidden_size)
    (tmp_path / STAGE2).mkdir()
    save_stage2_segments(tmp_path / STAGE2 / "chunk-00000.safetensors", store)
    heads = _mlp_heads(target)
    learner = OnlineLearner(heads, LearnConfig(**CFG, replay_share=0.25), out=tmp_path)
    assert learner.replay.tokens == 40 and learner.metrics()["replay_tokens"] == 40
    E = target.config.hidden_size
    learner.record_request(torch.arange(30), torch.randn(29, E))
    tokens = learner._windows_of(400, 8)[1]
    stored = (tokens >= 100).any(-1)
    assert bool((tokens[stored] >= 100).all()) and bool((tokens[~stored] < 100).all())
    assert 0.18 <= stored.float().mean() <= 0.32
    for learner in (
        OnlineLearner(heads, LearnConfig(**CFG, replay_share=0.0), out=tmp_path),
        OnlineLearner(heads, LearnConfig(**CFG), out=tmp_path / "none"),
    ):
        assert learner.replay is None
        learner.record_request(torch.arange(30), torch.randn(29, E))
        assert bool((learner._windows_of(50, 8)[1] < 100).all())


def test_stored_data_of_another_width_is_left_out_with_a_warning(target, tmp_path, caplog):
    (tmp_path / STAGE2).mkdir()
    wrong = _segments(range(20), width=3 * target.config.hidden_size)
    save_stage2_segments(tmp_path / STAGE2 / "chunk-00000.safetensors", wrong)
    (tmp_path / STAGE2 / "chunk-00001.safetensors").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="specdec.learn"):
        learner = OnlineLearner(_mlp_heads(target), LearnConfig(**CFG), out=tmp_path)
    assert learner.replay is None
    assert "states of width" in caplog.text and "chunk-00001" in caplog.text


def test_replay_keeps_what_a_trained_head_learnt_offline(target, tokenizer, tmp_path):
    """Heads trained on one stream, then learning another: both ways the new stream takes
    fewer passes (fails if learning is a no-op); with the first stream's stage-2 data
    replayed the head also stays at least as good on it (seen: 32 -> 25-26 passes over
    four seeds), where the new traffic alone wears it down (32 -> 33-35)."""
    trainer = OnlineLearner(_mlp_heads(target), LearnConfig(**CFG))
    engine = _engine(target, tokenizer, trainer)
    for _ in range(8):  # "offline": the first stream, repeated
        engine.generate(OFFLINE, GREEDY)
        trainer.train_steps(10)
    trained = trainer.published
    offline_before, _ = _passes(target, tokenizer, trainer, OFFLINE)
    traffic_before, _ = _passes(target, tokenizer, trainer, TRAFFIC)
    _store(target, tokenizer, OFFLINE, tmp_path / "heads")
    after = {}
    for share in (0.5, 0.0):
        cfg = LearnConfig(**CFG, replay_share=share, warmup_steps=0)
        learner = OnlineLearner(copy_heads(trained, trained), cfg, out=tmp_path / "heads")
        assert (learner.replay is not None) == (share > 0)
        engine = _engine(target, tokenizer, learner)
        for _ in range(8):
            engine.generate(TRAFFIC, GREEDY)
            learner.train_steps(10)
        after[share] = (
            _passes(target, tokenizer, learner, OFFLINE)[0],
            _passes(target, tokenizer, learner, TRAFFIC)[0],
        )
    (offline_mixed, traffic_mixed), (offline_alone, traffic_alone) = after[0.5], after[0.0]
    assert traffic_mixed < 0.8 * traffic_before and traffic_alone < 0.8 * traffic_before
    assert offline_mixed <= offline_before < offline_alone, (offline_before, after)


def _eagle3_learner(target, cfg, out=None):
    torch.manual_seed(0)
    head = build_eagle3(target, intermediate_size=64, n_predict=3, aux_layer_ids=AUX)
    return OnlineLearner(head.eval().requires_grad_(False), cfg, out=out)


def test_an_eagle3_head_learns_from_traffic_with_its_stored_data(target, tokenizer, tmp_path):
    """An untrained EAGLE-3 head learns from the target's auxiliary states (the traffic,
    with its directory's stage-2 data replayed): the same requests take fewer passes, the
    output stays plain greedy's through the swaps, and its checkpoint in vLLM's layout
    loads and resumes."""
    plain = [o.token_ids for o in Engine(target, tokenizer, frozenset()).generate(TRAFFIC, GREEDY)]
    heads_dir = tmp_path / "heads"
    learner = _eagle3_learner(target, LearnConfig(**CFG), out=heads_dir)
    learner.published.save(heads_dir)
    _store(target, tokenizer, OFFLINE, heads_dir, AUX)
    learner = _eagle3_learner(target, LearnConfig(**CFG), out=heads_dir)
    assert learner.reads_aux and learner.replay.tokens > 0
    before, outs = _passes(target, tokenizer, learner, TRAFFIC, Eagle3Drafter)
    assert outs == plain
    E = target.config.hidden_size
    assert all(h.shape[-1] == 3 * E for _, h in learner.buffer.segments)
    first_loss = None
    for _ in range(8):
        assert learner.train_steps(10) == 10
        first_loss = first_loss if first_loss is not None else learner.loss
        after, outs = _passes(target, tokenizer, learner, TRAFFIC, Eagle3Drafter)
        assert outs == plain
    assert learner.loss < 0.9 * first_loss and after < 0.8 * before, (before, after)
    learner.close()
    saved = load_eagle3(heads_dir, target)
    for name, value in learner.published.state_dict().items():
        torch.testing.assert_close(saved.state_dict()[name], value)
    again = _eagle3_learner(target, LearnConfig(**CFG), out=heads_dir)
    assert again.steps == learner.steps
    assert json.loads((heads_dir / "learn_state.json").read_text())["steps"] == learner.steps


def test_the_cli_learns_with_an_eagle3_head_and_replays(tmp_path, capsys):
    """`--draft EAGLE3_DIR --learn`: the learner replays the directory's stage-2 data
    (`--learn-replay` sets the share) and checkpoints there."""
    from specdec.cli import main
    from specdec.models.loading import load_transformer

    from tiny import tiny_tokenizer

    model = tmp_path / "model"
    hf_tiny("qwen2", num_hidden_layers=4).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    target = load_transformer(model, "fp32")
    head = build_eagle3(target, intermediate_size=32, n_predict=2, aux_layer_ids=AUX)
    head.save(tmp_path / "eagle3")
    _store(target, tiny_tokenizer(), OFFLINE, tmp_path / "eagle3", AUX)
    argv = ["generate", "--model", str(model), "--dtype", "fp32"]
    argv += ["--draft", f"eagle3:{tmp_path / 'eagle3'}", "--learn", "--learn-budget", "1"]
    argv += ["--learn-replay", "0.3", "--max-tokens", "40", "--ignore-eos", "abcabc"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert '"replay_tokens": ' in err and '"replay_tokens": 0' not in err, err[-800:]
    assert (tmp_path / "eagle3" / "learn_state.json").is_file()
    load_eagle3(tmp_path / "eagle3", target)
    bad = [*argv[:-1], "--learn-replay", "1", "abc"]
    assert main(bad) != 0
    assert "replay_share must be in [0, 1)" in capsys.readouterr().err


def test_sampling_with_no_stored_windows_leaves_the_rng_as_before(target):
    """Without stored data the windows are drawn exactly as before replay existed."""
    E = target.config.hidden_size
    a = OnlineLearner(_mlp_heads(target), LearnConfig(**CFG))
    a.record_request(torch.arange(40), torch.randn(39, E))
    want = a.buffer.sample(4, 8, random.Random(0), with_states=True)
    a._rng = random.Random(0)
    for got, expected in zip(a._windows_of(4, 8), want, strict=True):
        assert torch.equal(got, expected)
