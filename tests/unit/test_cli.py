"""The CLI end to end on a tiny model saved as a Hugging Face directory."""

import json
from pathlib import Path

import pytest

from specdec.cli import main

from tiny import hf_tiny, tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    hf_tiny("qwen2").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json(model_dir, capsys):
    code, out, _ = _run(
        capsys,
        "generate",
        "--model",
        str(model_dir),
        "--dtype",
        "fp32",
        "--json",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "def f(",
        "x = 1",
    )
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in rows] == ["def f(", "x = 1"]
    for row in rows:
        assert row["num_generated"] == 6 == len(row["token_ids"])
        assert row["elapsed_s"] > 0 and row["tokens_per_s"] > 0
        assert isinstance(row["text"], str) and row["finish_reason"] == "length"


def test_generate_plain_text_is_reproducible_with_a_seed(model_dir, capsys):
    argv = [
        "generate",
        "--model",
        str(model_dir),
        "--dtype",
        "fp32",
        "--temperature",
        "1",
        "--top-k",
        "20",
        "--seed",
        "3",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "hello",
    ]
    first, second = _run(capsys, *argv)[1], _run(capsys, *argv)[1]
    assert first.splitlines()[0] == second.splitlines()[0]
    assert "tok/s" in first


def test_missing_path_is_a_clear_error(tmp_path, capsys):
    code, out, err = _run(capsys, "generate", "--model", str(tmp_path / "nope"), "hi")
    assert code == 2 and out == ""
    assert "does not exist" in err and "Traceback" not in err


def test_truncated_weights_are_a_clear_error(model_dir, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:5000])
    code, _, err = _run(capsys, "generate", "--model", str(broken), "hi")
    assert code == 2
    assert "corrupt or truncated safetensors file" in err and weights.name in err


def test_unsupported_architecture_is_a_clear_error(model_dir, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(config))
    code, _, err = _run(capsys, "generate", "--model", str(other), "hi")
    assert code == 2 and "'GPT2LMHeadModel' is not supported" in err


def test_bad_sampling_parameter_and_chat_without_template(model_dir, capsys):
    code, _, err = _run(capsys, "generate", "--model", str(model_dir), "--top-p", "0", "hi")
    assert code == 2 and "top_p must be in (0, 1]" in err
    code, _, err = _run(capsys, "generate", "--model", str(model_dir), "--chat", "hi")
    assert code == 2 and "no chat template" in err


def test_prompt_longer_than_context(model_dir, capsys):
    code, _, err = _run(capsys, "generate", "--model", str(model_dir), "x" * 300)
    assert code == 2 and "context is 256 tokens" in err


def test_speculative_json_has_spec_metrics_and_matches_plain(model_dir, capsys):
    base = [
        "generate",
        "--model",
        str(model_dir),
        "--dtype",
        "fp32",
        "--json",
        "--max-tokens",
        "13",  # 1 from the prefill + 3 full steps of 3 drafts + 1
        "--ignore-eos",
        "def f(",
    ]
    _, plain, _ = _run(capsys, *base)
    spec_args = ["--draft", str(model_dir), "--speculate", "3"]
    code, spec, _ = _run(capsys, *base, *spec_args, "--draft-quant", "none")
    assert code == 0
    plain_row, spec_row = json.loads(plain), json.loads(spec)
    assert spec_row["token_ids"] == plain_row["token_ids"]
    # The default int4 draft drafts differently but the output is the target's all the same.
    _, quantized, _ = _run(capsys, *base, *spec_args)
    assert json.loads(quantized)["token_ids"] == plain_row["token_ids"]
    s = spec_row["spec"]
    assert s["drafted_tokens"] > 0 and s["acceptance_rate"] == 1.0  # self-drafting
    assert s["mean_accepted_length"] == 4.0 and len(s["acceptance_per_position"]) == 3
    for key in ("time_per_output_token_s", "time_to_first_token_s", "tokens_per_s", "drafts"):
        assert key in s


@pytest.mark.parametrize("draft", ["ngram", "suffix", None])
def test_auto_window_and_compare(model_dir, capsys, draft):
    argv = [
        "generate",
        "--model",
        str(model_dir),
        "--dtype",
        "fp32",
        "--max-tokens",
        "10",
        "--ignore-eos",
        "--speculate",
        "auto",
        "--compare",
        "--draft",
        draft or str(model_dir),
        "abcabcabc",
    ]
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and "speedup" in out and "identical output" in out


def test_custom_acceptor_from_a_file(model_dir, capsys):
    path = str(Path(__file__).parents[2] / "examples" / "deterministic_acceptor.py")
    code, out, _ = _run(
        capsys,
        "generate",
        "--model",
        str(model_dir),
        "--dtype",
        "fp32",
        "--json",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--draft",
        "ngram",
        "--speculate",
        "2",
        "--acceptor",
        f"{path}:LossyTopNAcceptor",
        "aaaa",
    )
    assert code == 0 and json.loads(out)["num_generated"] == 8


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--speculate", "3"], "speculation needs a drafter"),
        (["--draft", "ngram", "--speculate", "-1"], r"speculate must be in \[0, 32\]"),
        (["--draft", "ngram", "--speculate", "lots"], "speculate must be an integer or 'auto'"),
        (["--draft", "ngram", "--acceptor", "nope"], "unknown acceptor 'nope'"),
        (["--draft", "ngram", "--acceptor", "collections:OrderedDict"], "is not a TokenAcceptor"),
        (["--draft", "ngram", "--acceptor", "no_such_module:X"], "cannot load acceptor"),
        (["--draft", "suffix", "--suffix-tokens", "-1"], r"budget must be 0\.\.4194304 tokens"),
        (["--draft", "suffix", "--suffix-tokens", "9999999"], "got 9999999"),
    ],
)
def test_bad_speculation_options(model_dir, capsys, extra, message):
    import re

    code, _, err = _run(capsys, "generate", "--model", str(model_dir), *extra, "hi")
    assert code == 2 and re.search(message, err), err


def test_mismatched_draft_tokenizer_is_refused(model_dir, tmp_path, capsys):
    import shutil

    other = tmp_path / "other-tokenizer"
    shutil.copytree(model_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["<unk2>"] = vocab.pop("~")  # same size, one token differs
    (other / "tokenizer.json").write_text(json.dumps(tok))
    code, _, err = _run(capsys, "generate", "--model", str(model_dir), "--draft", str(other), "hi")
    assert code == 2 and "tokenizer differs from the target's" in err


def test_models_list(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    code, out, _ = _run(capsys, "models", "list")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert names == [
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
    ]
    assert "converted: -" in out


def test_models_pull_unknown_name(capsys):
    code, _, err = _run(capsys, "models", "pull", "no-such-model")
    assert code == 2 and "no-such-model" in err


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_no_cuda_graphs_flag_parses(command):
    from specdec.cli import build_parser

    argv = {"generate": ["--model", "m", "p"], "serve": ["--model", "m"], "bench": []}[command]
    args = build_parser().parse_args([command, *argv, "--no-cuda-graphs"])
    assert args.cuda_graphs is False
    assert build_parser().parse_args([command, *argv]).cuda_graphs is True


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_no_fused_layers_flag_parses(command):
    from specdec.cli import build_parser

    argv = {"generate": ["--model", "m", "p"], "serve": ["--model", "m"]}[command]
    assert not build_parser().parse_args([command, *argv, "--no-fused-layers"]).fused_layers
    assert build_parser().parse_args([command, *argv]).fused_layers


@pytest.mark.parametrize("fused", [True, False])
def test_fused_layers_option_sets_both_models_layer_stack(model_dir, fused):
    """`--no-fused-layers` pins the target's and the draft model's passes to their own
    layers; by default the first CUDA-graph capture races the stacks (None until then)."""
    from specdec.llm import LLM

    llm = LLM(str(model_dir), dtype="fp32", draft=str(model_dir), fused_layers=fused)
    want = None if fused else "eager"
    assert llm.model.layer_stack == want and llm.draft_model.layer_stack == want


def test_no_cuda_graphs_is_ignored_on_the_cpu(model_dir, capsys):
    """On the CPU the passes are eager either way: the same output, flag or not."""
    outs = []
    for extra in ([], ["--no-cuda-graphs"]):
        argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json"]
        code, out, _ = _run(capsys, *argv, "--max-tokens", "5", "--ignore-eos", *extra, "ab")
        assert code == 0
        outs.append(json.loads(out)["token_ids"])
    assert outs[0] == outs[1]


def test_llm_engine_options_are_eager_on_the_cpu(model_dir):
    from specdec.llm import LLM

    llm = LLM(str(model_dir), dtype="fp32", draft="ngram", speculate=2)
    assert llm.engine_options == {"static_passes": False, "cuda_graphs": False}
    assert llm.engine._target is llm.model or llm.engine._cache is None
    assert not llm.engine.static_passes and not llm.plain_engine().static_passes


def test_draft_vocab_leaves_greedy_output_unchanged(model_dir, capsys, monkeypatch):
    """`--draft-vocab N` cuts the draft model's head to N ids (ranked here by a stub
    instead of the ShareGPT count): fp32 greedy output is plain decoding's."""
    from specdec.drafters import draft_vocab

    monkeypatch.setattr(draft_vocab, "_ranked_ids", lambda tok: list(range(96, -1, -1)))
    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json", "--ignore-eos"]
    argv += ["--max-tokens", "12"]
    code, out, _ = _run(capsys, *argv, "ab")
    assert code == 0
    spec = [*argv, "--draft", str(model_dir), "--draft-vocab", "40", "--speculate", "3"]
    code, out_spec, _ = _run(capsys, *spec, "ab")
    assert code == 0
    assert json.loads(out_spec)["token_ids"] == json.loads(out)["token_ids"]
    assert json.loads(out_spec)["spec"]["drafted_tokens"] > 0


def test_cpu_drafts_default_to_the_lowest_ids_and_the_context(model_dir, monkeypatch):
    """By default a CPU draft model's head is cut to the lowest ids (here 40 of 97, the
    cut's size patched down), widened by each request's own ids; `draft_vocab=0` keeps
    the whole head. Either way fp32 greedy output is plain decoding's."""
    import specdec.llm as llm_module
    from specdec import LLM, SamplingParams

    monkeypatch.setattr(llm_module, "AUTO_DRAFT_VOCAB", 40)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outputs = {}
    for vocab in (None, 0):
        llm = LLM(
            str(model_dir), dtype="fp32", draft=str(model_dir), speculate=3, draft_vocab=vocab
        )
        outputs[vocab] = llm.generate(["abcab"], params)[0]
        drafter = llm.engine._drafter
        assert llm.draft_head == (
            "the lowest 40 ids + each request's own" if vocab is None else "whole"
        )
        if vocab is None:
            kept = drafter.vocab.tolist()
            assert len(kept) == 40 and kept[:30] == list(range(30))
            assert drafter.context is not None and len(drafter.context.rows) == 0
        else:
            assert drafter.vocab is None and drafter.context is None
        plain = llm.plain_engine().generate([llm.encode("abcab")], params)[0]
        assert outputs[vocab].token_ids == plain.token_ids
    assert outputs[None].stats.drafted > 0


def test_draft_vocab_needs_a_draft_model(model_dir, capsys):
    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--draft", "ngram"]
    code, _, err = _run(capsys, *argv, "--draft-vocab", "40", "ab")
    assert code == 2
    assert "--draft-vocab" in err and "draft model" in err


def test_generate_with_an_eagle_head(model_dir, tmp_path, capsys):
    """`--draft EAGLE_DIR` drafts with the head, at a fixed k, with `auto` (capped at
    the head's n_predict) and as a candidate tree, and the output is the target's."""
    from specdec.heads.eagle import build_eagle
    from specdec.models.loading import load_transformer

    head = build_eagle(load_transformer(model_dir, "fp32"), intermediate_size=32, n_predict=2)
    head.save(tmp_path / "eagle")
    base = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json"]
    base += ["--max-tokens", "12", "--ignore-eos", "abcabcabc"]
    _, plain, _ = _run(capsys, *base)
    for k in ("3", "auto"):
        code, out, _ = _run(capsys, *base, "--draft", str(tmp_path / "eagle"), "--speculate", k)
        row = json.loads(out)
        assert code == 0 and row["token_ids"] == json.loads(plain)["token_ids"]
        if k == "3":
            assert len(row["spec"]["acceptance_per_position"]) == 2  # n_predict caps it
    tree = ["--draft", str(tmp_path / "eagle"), "--tree", "2,2", "--speculate", "2"]
    code, out, _ = _run(capsys, *base, *tree)
    assert code == 0 and json.loads(out)["token_ids"] == json.loads(plain)["token_ids"]


def test_generate_with_an_eagle3_head_in_vllms_layout(tmp_path, capsys):
    """`--draft EAGLE3_DIR` (vLLM's `llama_eagle3` layout) drafts chains and trees with
    the target's output; a head whose `d2t` leaves the vocabulary is refused in one line."""
    import torch
    from safetensors.torch import load_file, save_file

    from specdec.heads.eagle3 import build_eagle3
    from specdec.models.loading import load_transformer

    model_dir = tmp_path / "tiny3"  # three layers: the head reads three distinct ones
    hf_tiny("qwen2", num_hidden_layers=3).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    target = load_transformer(model_dir, "fp32")
    head = build_eagle3(target, torch.arange(0, 97, 2), 32, n_predict=2, aux_layer_ids=(0, 1, 2))
    head.save(tmp_path / "eagle3")
    base = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json"]
    base += ["--max-tokens", "12", "--ignore-eos", "abcabcabc"]
    _, plain, _ = _run(capsys, *base)
    for extra in (["--speculate", "3"], ["--speculate", "auto"], ["--tree", "2,2"]):
        code, out, _ = _run(capsys, *base, "--draft", str(tmp_path / "eagle3"), *extra)
        assert code == 0 and json.loads(out)["token_ids"] == json.loads(plain)["token_ids"]
    tensors = load_file(tmp_path / "eagle3" / "model.safetensors")
    tensors["d2t"][-1] = 1000
    save_file(tensors, tmp_path / "eagle3" / "model.safetensors")
    code, out, err = _run(capsys, *base, "--draft", str(tmp_path / "eagle3"))
    assert code == 2 and "d2t maps draft id 48 to target id 1048" in err
    assert "Traceback" not in err


def test_serve_refuses_an_oversized_suffix_store_before_serving(model_dir, capsys):
    """The suffix store's bound is a launch option: `serve` asked for more exits with the
    reason (no traceback, no server); requests cannot size the store."""
    argv = ["serve", "--model", str(model_dir), "--draft", "suffix", "--port", "1"]
    code, out, err = _run(capsys, *argv, "--suffix-tokens", str(2**23))
    assert code == 2 and "budget must be 0..4194304 tokens, got 8388608" in err, err
    assert "Traceback" not in err and "serving" not in out
