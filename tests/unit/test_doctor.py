"""`specdec doctor`: the bound arithmetic on a real config, and the report end to end."""

import json

from specdec import doctor, host
from specdec.cli import main
from specdec.models.config import ModelConfig


def test_decode_bytes_counts_projections_and_head_not_the_embedding_table():
    cfg = ModelConfig.from_hf_dict(
        {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
            "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        }
    )  # fmt: skip
    # Qwen2.5 1.5B: 1.31 B projection weights + 0.23 B head, 2 bytes each.
    assert abs(doctor.decode_bytes(cfg) / 1e9 - 3.09) < 0.01
    assert doctor.decode_bytes(cfg, 0.5) * 4 == doctor.decode_bytes(cfg)


def test_kernel_rows_report_the_chosen_kernels_speed():
    cache = {
        "groups": {
            "Linear 8x8 bfloat16 nobias": {
                "plan": {"1": "a", "8": "b"},
                "seconds": {"1": {"a": 0.5, "b": 1.0}, "8": {"a": 2.0, "b": 1.0}},
                "bytes": 1e9,
            }
        }
    }
    assert doctor.kernel_rows(cache)[0]["gb_s"] == {"1": 2.0, "8": 1.0}


def test_the_int4_tile_prefetch_choice_is_reported_with_its_speeds(monkeypatch, tmp_path, capsys):
    entry = {"level": 1, "seconds": {"0": {"1": 2.0, "4": 4.0}, "1": {"1": 1.0, "4": 2.0}}}
    assert doctor.tile_prefetch_row({"tile_prefetch": {**entry, "bytes": 1e9}}) == {
        "level": 1,
        "source": "measured",
        "gb_s": {"0": {"1": 0.5, "4": 0.2}, "1": {"1": 1.0, "4": 0.5}},  # 0.25 rounds to even
    }
    assert doctor.tile_prefetch_row({}) is None
    data = {
        "machine": {"cpu": "x", "cores": 2, "torch": "t", "threads": 2},
        "read_bandwidth_gb_s": 1.0,
        "native_kernel": True,
        "kernel_cache": "k.json",
        "kernels": [],
        "int4_tile_prefetch": doctor.tile_prefetch_row({"tile_prefetch": {**entry, "bytes": 1e9}}),
        "models": [],
    }
    doctor.print_report(data)
    assert "int4 tile layout prefetches into L2 (into L1 0.5 GB/s" in capsys.readouterr().out


def test_the_bf16_panel_layout_is_reported_with_its_speeds(capsys):
    seconds = {"16x2": {"1": 1.0, "4": 2.0, "8": 4.0}, "32x1": {"1": 1.0, "4": 1.0, "8": 2.0}}
    entry = {"layout": [32, 1], "seconds": seconds, "bytes": 2e9}
    row = doctor.bf16_panels_row({"bf16_panels": entry})
    assert row == {
        "layout": "32x1",
        "source": "measured",
        "gb_s": {"16x2": {"1": 2.0, "4": 1.0, "8": 0.5}, "32x1": {"1": 2.0, "4": 2.0, "8": 1.0}},
    }
    assert doctor.bf16_panels_row({}) is None
    data = {
        "machine": {"cpu": "x", "cores": 2, "torch": "t", "threads": 2},
        "read_bandwidth_gb_s": 1.0,
        "native_kernel": True,
        "kernel_cache": "k.json",
        "kernels": [],
        "bf16_panels": row,
        "models": [],
    }
    doctor.print_report(data)
    out = capsys.readouterr().out
    assert "bf16 panels: 32x1 (GB/s at 1 / 4 / 8 rows: 16x2 2.0 / 1.0 / 0.5, 32x1 2.0" in out


def test_doctor_json_end_to_end(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr(doctor, "read_bandwidth_gbs", lambda gib=1.0: 50.0)
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["read_bandwidth_gb_s"] == 50.0 and data["kernels"] == []
    assert data["int4_tile_prefetch"] is None and data["bf16_panels"] is None
    assert {m["model"] for m in data["models"]} >= {"qwen2.5-coder-1.5b-instruct"}
    assert not any(m["pulled"] for m in data["models"])  # an empty cache
    assert main(["doctor"]) == 0
    assert "not pulled" in capsys.readouterr().out


def test_arithmetic_reports_one_thread_all_threads_and_says_when_they_share_cores(
    monkeypatch, capsys
):
    rates = {1: 50.0, 2: 60.0}
    monkeypatch.setattr(host, "matmul_gflops", lambda threads, seconds: rates[threads])
    compute = host.arithmetic(2)
    assert compute == {
        "threads": 2, "one_thread_gflops": 50.0, "all_threads_gflops": 60.0, "scaling": 1.2
    }  # fmt: skip
    data = {
        "machine": {"cpu": "x", "cores": 2, "torch": "t", "threads": 2},
        "read_bandwidth_gb_s": 1.0,
        "arithmetic": compute,
        "native_kernel": True,
        "kernel_cache": "k.json",
        "kernels": [],
        "models": [],
    }
    doctor.print_report(data)
    out = capsys.readouterr().out
    assert "fp32 matmul: 50.0 GFLOP/s on 1 thread, 60.0 on 2 (1.2x)" in out
    assert "share cores" in out
    rates[2] = 100.0
    doctor.print_report({**data, "arithmetic": host.arithmetic(2)})
    assert "share cores" not in capsys.readouterr().out


def test_matmul_rate_is_measured_and_leaves_the_thread_count_alone():
    import torch

    threads = torch.get_num_threads()
    assert host.matmul_gflops(1, n=64, seconds=0.01) > 0
    assert host.matmul_gflops(1, n=64, seconds=0) > 0  # one timed call even with no time
    assert torch.get_num_threads() == threads
