"""The two-stage trainer on a tiny target: loss falls, accuracy beats the trivial baseline,
trained heads draft losslessly, and a resumed run continues where the checkpoint was."""

import json
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch

import specdec.training.stages as train_mod
from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.cli import main
from specdec.drafters import SpeculatorDrafter
from specdec.engine import Engine
from specdec.errors import InvalidParameterError
from specdec.heads import load_speculator
from specdec.params import SamplingParams
from specdec.training.stages import Corpus, SpeculatorTrainer, TrainConfig
from specdec.training.target import TargetStates, Throughput, target_labels
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, tiny_tokenizer

PHRASES = ["the cat sat on the mat.", "a dog ran in the park.", "hello world, hello code."]


def corpus_docs(n=120, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(PHRASES) for _ in range(rng.randint(3, 8))) for _ in range(n)]


def _cfg(**overrides):
    base = dict(
        heads=3,
        stage1_steps=200,
        stage2_steps=60,
        batch_size=8,
        seq_len=48,
        lr=3e-3,
        stage2_lr=5e-3,
        checkpoint_every=50,
        log_every=20,
        reuse_target=False,
        inner_dim=32,
        stage2_prompts=8,
        stage2_max_tokens=24,
        eval_prompts=4,
        eval_max_tokens=16,
        progress=False,
        heads_autocast=False,  # the same arithmetic on every CPU (autocast: its own test)
    )
    return TrainConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2"))


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    torch.set_num_threads(1)  # module fixtures run before the autouse one
    out = tmp_path_factory.mktemp("heads")
    tok = tiny_tokenizer()
    trainer = SpeculatorTrainer(target, tok, Corpus(corpus_docs(), tok), out, _cfg())
    spec = trainer.run()
    return spec, out, trainer


def _log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_loss_falls_and_accuracy_beats_the_most_frequent_token(trained):
    _, out, _ = trained
    rows = [r for r in _log(out) if r.get("stage") == 1 and "loss" in r]
    assert rows[-1]["step"] == 200
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    counts = Counter("".join(corpus_docs()))
    baseline = counts.most_common(1)[0][1] / sum(counts.values())  # always the top character
    assert all(acc > baseline + 0.3 for acc in rows[-1]["acc_per_head"]), rows[-1]
    evals = json.loads((out / "eval.json").read_text())
    assert set(evals) == {"stage1", "stage2"}
    for stage in evals.values():
        assert len(stage["acceptance_per_head"]) == 3 and stage["mean_accepted_length"] >= 1
        assert 1 <= stage["walked_accepted_length"] <= 4
        assert stage["engine"]["mean_accepted_length"] >= 1
    assert (out / "config.json").is_file() and (out / "stage2").is_dir()


def test_throughput_of_target_and_heads_apart(trained):
    """Every log row carries both rates; the heads' steps are far cheaper than the target's
    passes per token, which is why cached states pay."""
    _, out, trainer = trained
    rows = [r for r in _log(out) if "loss" in r]
    assert rows and all(r["heads_tokens_per_s"] > 0 for r in rows)
    assert all(r["target_tokens_per_s"] > 0 for r in rows)
    tp = trainer.throughput
    assert tp.tokens["target"] > 0 and tp.tokens["heads"] > 0
    assert set(tp.postfix()) == {"target", "heads"}
    assert all(v.endswith("/s") for v in tp.postfix().values())


def test_progress_bar_shows_both_rates(target, tmp_path, capsys):
    tok = tiny_tokenizer()
    cfg = _cfg(stage1_steps=3, stage2_steps=0, log_every=1, eval_prompts=0, progress=True)
    SpeculatorTrainer(target, tok, Corpus(corpus_docs(20), tok), tmp_path, cfg).run()
    err = capsys.readouterr().err
    assert "target=" in err and "heads=" in err and "/s" in err


def test_throughput_before_anything_ran():
    tp = Throughput()
    assert tp.rate("target") is None and tp.postfix() == {"target": "-", "heads": "-"}
    tp.add("heads", 30_000, 2.0)
    assert tp.postfix()["heads"] == "15.0k/s" and tp.log()["heads_tokens_per_s"] == 15000.0


def test_trained_heads_are_lossless_and_accept(trained, target, tokenizer):
    _, out, trainer = trained
    heads = load_speculator(out, target)
    # Prompts whose continuations stage 2 trained on (the random target's outputs are
    # nothing like the corpus), and one never seen.
    prompts = [trainer.corpus.prompt_ids(i) for i in trainer.train_docs[:3]]
    prompts.append(tokenizer("x")["input_ids"])
    params = SamplingParams(temperature=0, max_tokens=30)
    plain = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(prompts, params)]
    for acceptor in (GreedyAcceptor(), RejectionSampler()):
        engine = Engine(
            target,
            tokenizer,
            frozenset(),
            max_batch=3,
            drafter_factory=lambda b, length: SpeculatorDrafter(heads, b),
            acceptor=acceptor,
            window=FixedWindow(3),
        )
        out_spec = engine.generate(prompts, params)
        assert [c.token_ids for c in out_spec] == plain
        assert sum(c.stats.accepted for c in out_spec) > 0
    # Candidate trees from the trained heads (the greedy chain is one of their paths): still
    # exact, and accepting.
    chain = sum(c.stats.accepted for c in out_spec)
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=3,
        drafter_factory=lambda b, length: SpeculatorDrafter(heads, b, tree=(3, 2, 2)),
        window=FixedWindow(3),
        max_tree_nodes=36,
    )
    out_tree = engine.generate(prompts, params)
    assert [c.token_ids for c in out_tree] == plain
    tree = sum(c.stats.accepted for c in out_tree)
    steps = sum(c.stats.steps for c in out_tree)
    print(f"accepted: chain {chain}, tree {tree} in {steps} passes")
    assert tree > 0


def _run_cut_after_25_steps(target, tok, docs, out, cfg, monkeypatch):
    """A run into `out` that crashes in its 26th step (the heads' loss raising), as a kill
    would; the real loss is back in place when it returns."""
    calls = {"n": 0}
    name = {"eagle": "eagle_losses", "eagle3": "eagle3_losses"}.get(cfg.kind, "head_losses")
    real = getattr(train_mod, name)

    def crash_at_step_25(*args):
        calls["n"] += 1
        if calls["n"] > 25:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(train_mod, name, crash_at_step_25)
    with pytest.raises(KeyboardInterrupt):
        SpeculatorTrainer(target, tok, Corpus(docs, tok), out, cfg).run()
    monkeypatch.setattr(train_mod, name, real)


@pytest.mark.parametrize("kind", ["mlp", "eagle"])
def test_resume_continues_at_the_checkpointed_step(kind, target, tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    docs = corpus_docs(60)
    cfg = _cfg(stage1_steps=30, stage2_steps=0, checkpoint_every=10, log_every=5, eval_prompts=0)
    cfg = replace(cfg, kind=kind, eagle_intermediate=32)
    whole = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "whole", cfg).run()

    _run_cut_after_25_steps(target, tok, docs, tmp_path / "cut", cfg, monkeypatch)
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert (state["stage"], state["step"]) == (1, 20)
    resumed = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "cut", cfg).run()
    steps = [r["step"] for r in _log(tmp_path / "cut") if "loss" in r]
    assert steps == [5, 10, 15, 20, 25, 25, 30]  # steps 21-25 ran again after the crash
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_cli_train_then_generate_with_the_heads(tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    hf_tiny("qwen2").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = tmp_path / "docs.txt"
    data.write_text("\n\n".join(corpus_docs(40)))
    out = tmp_path / "heads"
    argv = ["train-speculator", "--model", str(model_dir), "--data", str(data), "--out", str(out)]
    argv += ["--dtype", "fp32", "--stage1-steps", "20", "--stage2-steps", "5", "--seq-len", "32"]
    argv += ["--stage2-prompts", "4", "--stage2-max-tokens", "8", "--eval-prompts", "2"]
    argv += ["--eval-max-tokens", "8", "--batch-size", "4", "--draft-vocab", "40"]
    assert main(argv) == 0
    assert "stage2" in capsys.readouterr().out
    gen = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json", "--max-tokens"]
    gen += ["12", "--ignore-eos", "--temperature", "0", "the cat"]
    assert main(gen) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*gen, "--draft", str(out), "--speculate", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["spec"]["drafted_tokens"] > 0
    assert main([*gen, "--draft", str(out), "--speculate", "3", "--tree", "3,2,2"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["token_ids"] == plain["token_ids"]
    assert tree["spec"]["drafted_tokens"] > 0


@pytest.mark.parametrize("labels", ["text", "target"])
def test_stage1_epochs_over_cached_states(labels, target, tmp_path, monkeypatch):
    """stage1_data_steps: the target runs only for the fresh-text steps; later steps cycle
    over their cached states (and the target's labels, where it learns those), and a run
    cut in the cycling phase resumes bit-exactly."""
    from safetensors.torch import load_file

    tok = tiny_tokenizer()
    docs = corpus_docs(60)
    cfg = _cfg(
        stage1_steps=30, stage1_data_steps=10, stage2_steps=0, checkpoint_every=10,
        log_every=5, eval_prompts=0, stage1_labels=labels,
    )  # fmt: skip
    target_passes = {"n": 0}
    real_states = TargetStates.__call__
    real_labels = train_mod.target_labels

    def counting(self, *args, **kwargs):
        target_passes["n"] += 1
        return real_states(self, *args, **kwargs)

    def counting_labels(*args):
        target_passes["n"] += 1
        return real_labels(*args)

    monkeypatch.setattr(TargetStates, "__call__", counting)
    monkeypatch.setattr(train_mod, "target_labels", counting_labels)
    whole = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "whole", cfg).run()
    assert target_passes["n"] == (10 if labels == "text" else 20)
    files = sorted((tmp_path / "whole" / "stage1").glob("batch-*.safetensors"))
    assert len(files) == 10
    saved = load_file(str(files[0]))
    assert ("labels" in saved) is (labels == "target")
    if labels == "target":
        assert torch.equal(saved["labels"], real_labels(target, saved["hidden"], saved["tokens"]))
    rows = [r for r in _log(tmp_path / "whole") if "loss" in r]
    assert rows[-1]["step"] == 30 and rows[-1]["loss"] < rows[0]["loss"]

    _run_cut_after_25_steps(target, tok, docs, tmp_path / "cut", cfg, monkeypatch)
    target_passes["n"] = 0
    resumed = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "cut", cfg).run()
    assert target_passes["n"] == 0  # steps 21-30 read the cache
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_stage1_cut_in_the_fresh_phase_resumes_bit_exactly(target, tmp_path, monkeypatch):
    """Cut in step 26 of 28 fresh-text steps (its batch already cached), checkpoint at 20:
    batches 20-25 are cached past the checkpoint. The resumed run reads them from the cache
    and the stream still moves past them, so steps 26-27 see the text they would have, not
    batches 20-21 again."""
    tok = tiny_tokenizer()
    docs = corpus_docs(60)
    cfg = _cfg(
        stage1_steps=30, stage1_data_steps=28, stage2_steps=0, checkpoint_every=10,
        log_every=5, eval_prompts=0,
    )  # fmt: skip
    whole = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "whole", cfg).run()
    _run_cut_after_25_steps(target, tok, docs, tmp_path / "cut", cfg, monkeypatch)
    assert len(list((tmp_path / "cut" / "stage1").glob("batch-*.safetensors"))) == 26
    resumed = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "cut", cfg).run()
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_the_target_dtype_follows_the_cpus_bf16_support(monkeypatch):
    """bf16 unless the CPU lacks bf16 matmul instructions (emulated bf16 made the target's
    states 6.4x slower than fp32 on an AVX2 CPU); bf16 on a GPU."""
    import torch

    from specdec.training.target import target_dtype

    for native, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda n=native: n)
        assert target_dtype("cpu") == want
    assert target_dtype("cuda") == "bf16"


def test_heads_learn_under_bf16_autocast_with_fp32_weights(target, tmp_path, monkeypatch):
    """Under bf16 autocast (the default where the target runs in bf16: 2.0-2.1x the fp32
    heads' positions per second on an AMX Xeon) the heads still learn: stage-1 loss halves
    and every head beats the most frequent token, while their weights and the optimizer's
    state stay fp32. The default follows the CPU's bf16 support."""
    from specdec.training.target import heads_autocast

    tok = tiny_tokenizer()
    cfg = _cfg(stage2_steps=0, heads_autocast=True)
    trainer = SpeculatorTrainer(target, tok, Corpus(corpus_docs(), tok), tmp_path, cfg)
    assert trainer.autocast
    spec = trainer.run()
    rows = [r for r in _log(tmp_path) if r.get("stage") == 1 and "loss" in r]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    counts = Counter("".join(corpus_docs()))
    baseline = counts.most_common(1)[0][1] / sum(counts.values())
    assert all(acc > baseline + 0.3 for acc in rows[-1]["acc_per_head"]), rows[-1]
    assert all(p.dtype == torch.float32 for p in spec.parameters())
    for native, want in ((True, True), (False, False)):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda n=native: n)
        assert heads_autocast("cpu") is want
        assert SpeculatorTrainer(target, tok, Corpus(corpus_docs(), tok), tmp_path / "d",
                                 _cfg(heads_autocast=None)).autocast is want  # fmt: skip


def test_stage1_can_learn_the_targets_own_choices(target, tmp_path):
    """`stage1_labels="target"`: the heads learn the target's greedy choice after each
    prefix of the text (what greedy verification keeps), not the text's next token. The
    labels are the argmax of the target's logits one position back, and heads trained on
    them match those choices better than the text, where heads trained on text do the
    opposite (so the labels are what the loss used)."""
    from specdec.training.corpus import PackedStream
    from specdec.training.losses import head_losses

    tok = tiny_tokenizer()
    corpus = Corpus(corpus_docs(), tok)
    heads = {}
    for labels in ("text", "target"):
        cfg = _cfg(stage1_steps=120, stage2_steps=0, stage1_labels=labels)
        trainer = SpeculatorTrainer(target, tok, corpus, tmp_path / labels, cfg)
        heads[labels] = trainer.run()

    stream = PackedStream(corpus, trainer.eval_docs * 8, 4, 48, tok.eos_token_id)
    tokens = stream.next_batch()
    hidden = trainer.states(tokens)
    labels = target_labels(target, hidden, tokens)
    cache = target.new_cache(4, 48)
    logits = target(tokens, cache).logits  # [B, T, V]
    assert torch.equal(labels[:, 1:], logits[:, :-1].argmax(-1))
    assert torch.equal(labels[:, 0], tokens[:, 0])
    assert (labels[:, 1:] != tokens[:, 1:]).any()  # the target disagrees with the text

    valid = torch.ones_like(tokens, dtype=torch.bool)

    def accuracy(spec, wanted):
        with torch.no_grad():
            return sum(head_losses(spec, hidden, tokens, valid, wanted)[1].acc_per_head)

    on_text, on_target = heads["text"], heads["target"]
    assert accuracy(on_target, labels) > accuracy(on_target, tokens)
    assert accuracy(on_text, tokens) > accuracy(on_text, labels)
    with pytest.raises(InvalidParameterError, match="stage1_labels"):
        _cfg(stage1_labels="teacher")


def test_an_eagle_head_learns_in_both_stages_and_drafts_losslessly(target, tmp_path):
    """`kind="eagle"`: the same two stages train one decoder layer over the target's
    states; loss falls, its held-out chains beat one token a pass by far (offline and in
    the engine), and drafting with it leaves greedy output unchanged."""
    tok = tiny_tokenizer()
    cfg = _cfg(kind="eagle", eagle_intermediate=32, stage1_steps=120, stage2_steps=30)
    trainer = SpeculatorTrainer(target, tok, Corpus(corpus_docs(), tok), tmp_path, cfg)
    untrained = trainer.new_speculator()
    head = trainer.run()
    results = json.loads((tmp_path / "eval.json").read_text())
    for stage in ("stage1", "stage2"):
        for where in (results[stage], results[stage]["engine"]):
            assert where["mean_accepted_length"] > 2.0, results[stage]
    # On held-out text, every draft step of the trained head picks the target's choice
    # far more often than the untrained head does (0.51 against 0.24-0.36 here), at a
    # lower loss. (Acceptance cannot show it on this tiny target: its greedy outputs
    # loop, and the untrained head, which repeats the target's last choice, already reads
    # ~4 tokens a pass on them.)
    ids = torch.tensor([tok(d)["input_ids"][:40] for d in corpus_docs(4, seed=9)])
    hidden = TargetStates(target)(ids)
    valid = torch.ones_like(ids, dtype=torch.bool)

    labels = target_labels(target, hidden, ids)

    @torch.no_grad()
    def loss(h):
        noise = torch.Generator().manual_seed(0)
        return train_mod.eagle_losses(h, hidden, ids, valid, labels, 3, 0.1, noise)

    (before, b), (after, a) = loss(untrained), loss(head)
    assert float(after) < float(before)
    for step_before, step_after in zip(b.acc_per_head, a.acc_per_head, strict=True):
        assert step_after > step_before + 0.1, (b.acc_per_head, a.acc_per_head)
    from specdec.drafters import EagleDrafter
    from specdec.heads.eagle import is_eagle_dir, load_eagle

    assert is_eagle_dir(tmp_path)
    loaded = load_eagle(tmp_path, target)
    for a, b in zip(head.parameters(), loaded.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    prompts = [tok("the cat")["input_ids"], tok("hello")["input_ids"]]
    params = SamplingParams(temperature=0, max_tokens=20)
    plain = Engine(target, tok, frozenset()).generate(prompts, params)
    engine = Engine(
        target,
        tok,
        frozenset(),
        drafter_factory=lambda b, length: EagleDrafter(loaded, b, length),
        acceptor=GreedyAcceptor(),
        window=FixedWindow(3),
    )
    spec = engine.generate(prompts, params)
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]


def test_walked_windows_follow_the_engine_not_the_mean_over_positions():
    """Chains of 3 over 8 positions, the first 4 easy (every draft right) and the last 4
    hard (none): the engine takes one pass for the easy stretch (4 tokens) and one per
    hard position (1 token each), 8 tokens in 5 passes = 1.6, where the mean over
    positions reads 1 + 12 / 8 = 2.5. A stretch where drafts 0-1 of 3 are right walks in
    steps of 3."""
    from specdec.training.stages import walked_windows

    easy, hard = [True] * 3, [False] * 3
    run = torch.tensor([easy] * 4 + [hard] * 4, dtype=torch.long)
    assert walked_windows(run) == (8, 5)
    assert 1 + run.sum().item() / len(run) == 2.5
    two = torch.tensor([[1, 1, 0]] * 9, dtype=torch.long)
    assert walked_windows(two) == (9, 3)
    assert walked_windows(torch.zeros(0, 3, dtype=torch.long)) == (0, 0)
