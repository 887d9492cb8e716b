"""scripts/bench_gpu.py (the GPU row's figures) runs end to end on the CPU with
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


def test_speculation_script_reports_every_figure_on_the_cpu(tmp_path, script):
    """scripts/gpu_speculation.py (speculation on a GPU in one device call) runs end to end
    on the CPU in its quick mode: static passes eagerly, the head's too, every profile timed
    with the acceptance-controlled drafter. fp32: the runs follow their records exactly."""
    from specdec.bench.timing_drafter import PROFILES

    out = tmp_path / "spec.json"
    result = script("gpu_speculation").main(
        ["--device", "cpu", "--quick", "--dtype", "fp32", "--out", str(out)]
    )
    assert json.loads(out.read_text())["bars"] == result["bars"]
    assert result["static_passes"] and not result["cuda_graphs"] and result["bound_tok_s"] > 0
    assert result["tree_verify"]["nodes"] == 6 and result["tree_verify"]["ratio"] > 0
    assert set(result["by_batch"]) == {"1", "2"}
    for figures in result["by_batch"].values():
        assert figures["plain_tok_s"] > 0 and sorted(figures["v"]) == list(range(6))
        assert figures["head"]["c_first"] > 0 and figures["head"]["eager_c_first"] > 0
        assert set(figures["speculation"]) == set(PROFILES)
        for spec in figures["speculation"].values():
            assert 0 <= spec["best_k"] <= 5
            for mode in ("fixed", "auto"):
                run = spec[mode]
                assert run["tok_s"] > 0 and run["timed_speedup"] > 0 and run["off_record"] == 0
                assert len(run["realised_alpha"]) == len(run["reached"]) <= 5
            assert spec["fixed"]["k"] >= 1 and spec["fixed"]["predicted"] > 0
    assert set(result["bars"]) and all(v in (True, False, None) for v in result["bars"].values())
