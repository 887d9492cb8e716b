"""Training an EAGLE-3 head (`train-speculator --kind eagle3`): on a repeated stream the loss
falls and held-out acceptance rises well above the untrained head's (so a no-op learner
fails), a cut run resumes bit-exactly, and the CLI's head is vLLM's layout and drafts."""

import json
from dataclasses import replace

import pytest
import torch
from test_speculator_train import _cfg, _log, _run_cut_after_25_steps, corpus_docs

from specdec.cli import main
from specdec.errors import InvalidParameterError
from specdec.heads.eagle3 import Eagle3Head, is_eagle3_dir
from specdec.training.stages import Corpus, SpeculatorTrainer

from tiny import hf_tiny, native_from_hf, tiny_tokenizer

LAYERS = (1, 2, 3)


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2", num_hidden_layers=4))


def _eagle3(**overrides):
    base = dict(kind="eagle3", eagle_intermediate=32, eagle3_layers=LAYERS, reuse_target=True)
    return _cfg(**{**base, **overrides})


def test_training_lowers_loss_and_raises_acceptance(target, tmp_path):
    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    cfg = _eagle3(stage1_steps=100, stage2_steps=30, heads=3)
    trainer = SpeculatorTrainer(target, tok, Corpus(corpus_docs(), tok), tmp_path, cfg)
    assert trainer.aux_layers == LAYERS
    untrained = trainer.new_speculator()
    before = trainer.evaluate(untrained)
    head = trainer.run()
    assert isinstance(head, Eagle3Head)
    rows = [r for r in _log(tmp_path) if r.get("stage") == 1 and "loss" in r]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    # Held out, on the target's greedy answers: stage 1 learnt the text, which this random
    # target does not speak; stage 2 (its own answers) makes the head keep drafts, far
    # above the untrained head's ~1.0 tokens a pass.
    after = json.loads((tmp_path / "eval.json").read_text())["stage2"]
    assert after["mean_accepted_length"] > before["mean_accepted_length"] + 0.8, (before, after)
    engine_before = before["engine"]["mean_accepted_length"]
    assert after["engine"]["mean_accepted_length"] > engine_before + 0.8, (before, after)
    assert is_eagle3_dir(tmp_path)  # the final files: vLLM's layout


def test_resume_continues_at_the_checkpointed_step(target, tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    docs = corpus_docs(60)
    cfg = _eagle3(stage1_steps=30, stage2_steps=0, checkpoint_every=10, log_every=5)
    cfg = replace(cfg, eval_prompts=0)
    whole = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "whole", cfg).run()
    _run_cut_after_25_steps(target, tok, docs, tmp_path / "cut", cfg, monkeypatch)
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert (state["stage"], state["step"]) == (1, 20)
    resumed = SpeculatorTrainer(target, tok, Corpus(docs, tok), tmp_path / "cut", cfg).run()
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_bad_settings_are_refused():
    with pytest.raises(InvalidParameterError, match="stage1-labels text"):
        _eagle3(stage1_labels="target")
    with pytest.raises(InvalidParameterError, match="three layer ids"):
        _eagle3(eagle3_layers=(1, 2))
    with pytest.raises(InvalidParameterError, match=r"\[1, 3, 3\] repeat layer 3"):
        _eagle3(eagle3_layers=(1, 3, 3))


def test_cli_trains_an_eagle3_head_that_drafts(tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    hf_tiny("qwen2", num_hidden_layers=4).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = tmp_path / "docs.txt"
    data.write_text("\n\n".join(corpus_docs(40)))
    out = tmp_path / "heads"
    argv = ["train-speculator", "--model", str(model_dir), "--data", str(data), "--out", str(out)]
    argv += ["--kind", "eagle3", "--eagle3-layers", "1,2,3", "--eagle-intermediate", "32"]
    argv += ["--dtype", "fp32", "--stage1-steps", "20", "--stage2-steps", "5", "--seq-len", "32"]
    argv += ["--stage2-prompts", "4", "--stage2-max-tokens", "8", "--eval-prompts", "2"]
    argv += ["--eval-max-tokens", "8", "--batch-size", "4", "--draft-vocab", "40"]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 40
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    capsys.readouterr()
    gen = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json", "--max-tokens"]
    gen += ["12", "--ignore-eos", "--temperature", "0", "the cat"]
    assert main(gen) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*gen, "--draft", str(out), "--speculate", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and spec["spec"]["drafted_tokens"] > 0
    assert main(["train-speculator", *argv[1:-6], "--eagle3-layers", "1,x"]) == 2
