"""`specdec generate`'s penalties, logit_bias, logprobs and JSON flags, end to end on a tiny
model: they build the server's SamplingParams, change the output as they say, stay lossless
with speculation on, and refuse bad values in one line."""

import json

import pytest

from specdec.cli import build_parser, main
from specdec.cli_sampling import sampling_params
from specdec.serving.protocol import CompletionRequest

from tiny import hf_tiny, tiny_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"a": {"enum": ["xy", "z"]}},
    "required": ["a"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    hf_tiny("qwen2").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _generate(capsys, model_dir, *flags, prompts=("def f(",)):
    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--json", *flags]
    code = main([*argv, *prompts])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_the_flags_build_the_servers_sampling_params(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    argv = ["generate", "--model", "m", "--temperature", "0.7", "--top-p", "0.9", "--seed", "4"]
    argv += ["--max-tokens", "12", "--presence-penalty", "0.5", "--frequency-penalty", "-1.5"]
    argv += ["--logit-bias", "15=-100", "--logit-bias", "3=2.5", "--logprobs", "2"]
    argv += ["--json-schema", str(schema), "hi"]
    ours = sampling_params(build_parser().parse_args(argv))
    body = {
        "model": "m", "prompt": "hi", "temperature": 0.7, "top_p": 0.9, "seed": 4,
        "presence_penalty": 0.5, "frequency_penalty": -1.5,
        "logit_bias": {"15": -100, "3": 2.5}, "logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    }  # fmt: skip
    assert ours == CompletionRequest(**body).sampling_params(max_tokens=12)
    json_object = build_parser().parse_args(["generate", "--model", "m", "--json-object", "hi"])
    body = {"model": "m", "prompt": "hi", "response_format": {"type": "json_object"}}
    assert sampling_params(json_object).grammar == CompletionRequest(**body).grammar()


def test_logit_bias_steers_greedy_output(model_dir, capsys):
    [plain] = _generate(capsys, model_dir, "--max-tokens", "6", "--ignore-eos")
    first = plain["token_ids"][0]
    [banned] = _generate(
        capsys, model_dir, "--max-tokens", "6", "--ignore-eos", "--logit-bias", f"{first}=-100"
    )
    assert first not in banned["token_ids"]
    forced = 40 if first != 40 else 41
    [pushed] = _generate(
        capsys, model_dir, "--max-tokens", "6", "--ignore-eos", "--logit-bias", f"{forced}=100"
    )
    assert pushed["token_ids"] == [forced] * 6


def test_presence_penalty_changes_greedy_output(model_dir, capsys):
    """The tiny model repeats itself greedily; a penalty on what was said breaks that."""
    flags = ["--max-tokens", "24", "--ignore-eos"]
    [plain] = _generate(capsys, model_dir, *flags)
    [penalised] = _generate(capsys, model_dir, *flags, "--presence-penalty", "2")
    assert len(set(plain["token_ids"])) < 24  # it does repeat
    assert penalised["token_ids"] != plain["token_ids"]
    assert len(set(penalised["token_ids"])) > len(set(plain["token_ids"]))


def test_logprobs_in_json_output(model_dir, capsys):
    rows = _generate(
        capsys, model_dir, "--max-tokens", "5", "--ignore-eos", "--logprobs", "3",
        prompts=("def f(", "x = 1"),
    )  # fmt: skip
    for row in rows:
        entries = row["logprobs"]
        assert len(entries) == row["num_generated"] == 5
        for token_id, entry in zip(row["token_ids"], entries, strict=True):
            top = entry["top_logprobs"]
            assert len(top) == 3
            assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
            # greedy: the emitted token is the most likely one, its logprob a log probability
            assert entry["logprob"] == top[0]["logprob"] <= 0
            assert entry["token"] == top[0]["token"] == tiny_tokenizer().decode([token_id])
    [without] = _generate(capsys, model_dir, "--max-tokens", "2", "--ignore-eos")
    assert "logprobs" not in without


def test_logprobs_in_human_output(model_dir, capsys):
    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--max-tokens", "3"]
    assert main([*argv, "--ignore-eos", "--logprobs", "2", "def f("]) == 0
    lines = capsys.readouterr().out.splitlines()
    per_token = [line for line in lines if line.startswith("   ") and "[" in line]
    assert len(per_token) == 3


def test_json_schema_output_parses(model_dir, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    [row] = _generate(capsys, model_dir, "--max-tokens", "40", "--json-schema", str(schema))
    assert row["finish_reason"] == "stop"
    assert json.loads(row["text"])["a"] in ("xy", "z")
    [row] = _generate(capsys, model_dir, "--max-tokens", "3", "--json-object")
    assert row["text"].startswith("{")


@pytest.mark.parametrize("draft", ["ngram", "model:{model_dir}"])
def test_processed_speculative_output_equals_plain(model_dir, tmp_path, capsys, draft):
    """Penalties, a bias and logprobs with speculation on: plain decoding's tokens and
    logprobs (fp32 greedy)."""
    flags = ["--max-tokens", "20", "--ignore-eos", "--logprobs", "2"]
    flags += ["--presence-penalty", "0.8", "--frequency-penalty", "0.3", "--logit-bias", "40=4"]
    prompts = ("def f(x):", "a = [1, 2")
    plain = _generate(capsys, model_dir, *flags, prompts=prompts)
    spec_flags = ["--draft", draft.format(model_dir=model_dir), "--speculate", "3"]
    spec = _generate(capsys, model_dir, *flags, *spec_flags, prompts=prompts)
    for p, s in zip(plain, spec, strict=True):
        assert s["token_ids"] == p["token_ids"]
        assert s["spec"]["drafted_tokens"] > 0
        got = [(e["token"], e["logprob"]) for e in s["logprobs"]]
        want = [(e["token"], e["logprob"]) for e in p["logprobs"]]
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-4)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--logit-bias", "15"], "--logit-bias '15': write TOKEN_ID=BIAS"),
        (["--logit-bias", "x=1"], "write TOKEN_ID=BIAS"),
        (["--logit-bias", "3=1", "--logit-bias", "3=2"], "token 3 is given twice"),
        (["--logit-bias", "3=101"], r"logit_bias: values must be in [-100, 100]"),
        (["--logit-bias", "97=1"], "outside the vocabulary"),
        (["--presence-penalty", "2.5"], "presence_penalty must be in [-2, 2]"),
        (["--frequency-penalty", "-3"], "frequency_penalty must be in [-2, 2]"),
        (["--logprobs", "21"], "--logprobs 21: alternatives per token must be in [0, 20]"),
        (["--json-schema", "/nonexistent/schema.json"], "No such file"),
        (["--json-schema", "{bad}"], "does not compile"),
    ],
)
def test_bad_values_are_one_line_errors(model_dir, tmp_path, capsys, flags, message):
    if flags[0] == "--json-schema" and flags[1] == "{bad}":
        bad = tmp_path / "bad.json"
        bad.write_text('{"type": "foo"}')
        flags = ["--json-schema", str(bad)]
    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", *flags, "hi"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_a_schema_file_that_is_not_json(model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    argv = ["generate", "--model", str(model_dir), "--json-schema", str(bad), "hi"]
    assert main(argv) == 2
    assert "not JSON" in capsys.readouterr().err


def test_json_object_and_json_schema_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["generate", "--model", "m", "--json-object", "--json-schema", "s.json", "hi"]
        )
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize("cut", ["0", "60"])
def test_a_draft_model_drafts_inside_the_grammar(model_dir, tmp_path, capsys, cut):
    """A draft model proposes under the request's grammar, its vocabulary head whole
    (`--draft-vocab 0`) or cut to 60 of the 97 ids: with the target itself as the draft
    (fp32, greedy) every draft of the whole head is accepted, and most of the cut head's
    (7 of 9 here; a cut head that ignored the grammar had 0 of 27 accepted)."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    flags = ["--max-tokens", "12", "--json-schema", str(schema), "--speculate", "3"]
    flags += ["--draft", f"model:{model_dir}", "--draft-quant", "none", "--draft-vocab", cut]
    [row] = _generate(capsys, model_dir, *flags)
    assert json.loads(row["text"])["a"] in ("xy", "z")
    drafted, accepted = row["spec"]["drafted_tokens"], row["spec"]["accepted_tokens"]
    assert drafted > 0
    assert accepted == drafted if cut == "0" else accepted >= drafted / 2
