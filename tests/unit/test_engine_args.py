"""EngineArgs and the drafter kinds: one parse of `draft`, one place that validates, and the
command lines built from the same fields."""

from __future__ import annotations

import json

import pytest

from specdec.bench.cli import ENGINE_FLAGS
from specdec.cli import build_parser
from specdec.drafters.kinds import DraftSpec, parse_draft
from specdec.engine_args import EngineArgs
from specdec.errors import InvalidParameterError


def heads_dir(path, model_type: str):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(path)


def test_kinds_spelled_out_and_bare(tmp_path):
    mlp = heads_dir(tmp_path / "mlp", "mlp_speculator")
    eagle = heads_dir(tmp_path / "eagle", "specdec_eagle")
    assert parse_draft(None) is None
    assert parse_draft("ngram") == DraftSpec("ngram")
    assert parse_draft("model:qwen") == DraftSpec("model", "qwen")
    assert parse_draft("qwen") == DraftSpec("model", "qwen")
    assert parse_draft(mlp) == DraftSpec("heads", mlp)
    assert parse_draft(eagle) == DraftSpec("eagle", eagle)
    assert parse_draft(f"heads:{mlp}") == DraftSpec("heads", mlp)
    assert parse_draft(f"model:{mlp}") == DraftSpec("model", mlp)  # said so: taken as said


@pytest.mark.parametrize(
    "text, message",
    [
        ("ngram:3", "takes no value"),
        ("heads:", "names no heads"),
        ("eagle:{mlp}", "holds heads heads"),
        ("heads:{plain}", "describes no heads"),
        ("ngram", "ambiguous"),
    ],
)
def test_kinds_refuse_what_they_cannot_mean(tmp_path, monkeypatch, text, message):
    mlp = heads_dir(tmp_path / "mlp", "mlp_speculator")
    plain = heads_dir(tmp_path / "plain", "llama")
    (tmp_path / "ngram").mkdir()  # a directory named like a built-in drafter
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidParameterError, match=message):
        parse_draft(text.format(mlp=mlp, plain=plain))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"draft_tp": 2}, "draft_tp must be 1 or tp"),
        ({"draft": "ngram", "draft_vocab": 100}, "needs a draft model"),
        ({"draft": "ngram", "learn": True}, "--learn needs a speculator"),
        ({"draft": "ngram", "tree": "4,2"}, "--tree needs speculator heads"),
        ({"k_max": 0}, "k_max must be in"),
        ({"speculate": "often"}, "integer or 'auto'"),
        ({"speculate": 99}, "speculate must be in"),
        ({"quant": "int3"}, "quant must be one of"),
        ({"tree": "4,x"}, "tree must look like"),
        ({"draft_vocab": -1, "draft": "m"}, "draft_vocab must be >= 0"),
    ],
)
def test_engine_args_validate_before_loading(options, message):
    with pytest.raises(InvalidParameterError, match=message):
        EngineArgs(model="no-such-model", **options)


def test_engine_args_defaults_and_derived_fields(tmp_path):
    assert EngineArgs(model="m").window == 0
    assert EngineArgs(model="m", draft="ngram").window == "auto"
    assert EngineArgs(model="m", draft="ngram", speculate="3").window == 3
    mlp = heads_dir(tmp_path / "mlp", "mlp_speculator")
    assert EngineArgs(model="m", draft=mlp, tree="4,3").tree == (4, 3)
    fresh = str(tmp_path / "new-heads")  # --learn starts untrained heads in a new directory
    assert EngineArgs(model="m", draft=fresh, learn=True).draft_spec == DraftSpec("heads", fresh)


def test_flags_are_the_fields():
    argv = "generate --model m --draft ngram --speculate 4 --quant int4 --no-cuda-graphs"
    argv = argv.split() + ["--prefix-cache", "0", "--prefill-chunk", "64", "p"]
    args = EngineArgs.from_cli_args(build_parser().parse_args(argv), max_batch=3)
    assert args == EngineArgs(
        model="m", draft="ngram", speculate="4", quant="int4", cuda_graphs=False,
        prefix_cache_tokens=0, prefill_chunk="64", max_batch=3,
    )  # fmt: skip
    bench = build_parser().parse_args(["bench", "--quant", "int4", "--k-max", "4"])
    assert set(ENGINE_FLAGS) <= set(vars(bench))
    assert bench.model is None and bench.k_max == 4  # the preset fills the model in
