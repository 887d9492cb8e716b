"""scripts/bench_gpu.py (issue 14's GPU figures) runs end to end on the CPU with
`--device cpu --quick` (tiny shapes, a few tokens: seconds), static passes included, so a
GPU session only has to run it. Its figures here mean nothing; its shape is checked."""

import json


def test_quick_cpu_run_reports_every_figure(tmp_path, script):
    bench = script("bench_gpu")
    out = tmp_path / "gpu.json"
    result = bench.main(["--device", "cpu", "--quick", "--static-on-cpu", "--out", str(out)])
    assert json.loads(out.read_text())["bound_tok_s"] == result["bound_tok_s"] > 0
    for mode in ("graphs_on", "graphs_off"):
        figures = result[mode]
        assert set(figures["plain_tok_s"]) == {"1", "2"}
        assert all(rate > 0 for rate in figures["plain_tok_s"].values())
        assert sorted(figures["costs"]["v"]) == list(range(9)) and figures["costs"]["c"] > 0
        assert set(figures["predicted"]["by_k"]) == set(range(1, 9))
        assert 0 <= figures["predicted"]["best_k"] <= 8
    assert result["transformers"]["batch_1"] > 0 and result["transformers"]["compiled"] is False
    assert set(result["bars"]) and all(v in (True, False) for v in result["bars"].values())


def test_default_pair_shapes_are_the_published_configs(script):
    """The 1.5B shape reads the 3.09 GB of bf16 weights per token docs/benchmarks.md
    counts (the H200 section); the 0.5B is the default draft's shape."""
    from specdec.doctor import decode_bytes
    from specdec.models.config import ModelConfig

    bench = script("bench_gpu")
    target = ModelConfig.from_hf_dict(bench.TARGET)
    draft = ModelConfig.from_hf_dict(bench.DRAFT)
    assert round(decode_bytes(target) / 1e9, 2) == 3.09
    assert (draft.num_layers, draft.hidden_size, draft.num_heads) == (24, 896, 14)
    assert target.vocab_size == draft.vocab_size == 151936


def test_pass_profile_counts_kernels_of_both_layer_stacks(script):
    """scripts/gpu_pass_profile.py runs on the CPU (operators stand in for kernels)."""
    result = script("gpu_pass_profile").main(["--device", "cpu", "--quick", "--top", "2"])
    for model in ("target", "draft"):
        for stack in ("model", "fused"):
            for tokens in ("1 token(s)", "9 token(s)"):
                figures = result[f"{model} {stack} layers, {tokens}"]
                assert figures["kernels"] > 0 and figures["device_us"] > 0
                assert len(figures["top"]) == 2
