"""`specdec doctor`: what a user checks first when decoding looks slow.

The machine (what the kernel cache is keyed by), its measured read bandwidth, its fp32
arithmetic on one thread and on all of them, whether the native kernel builds here, the
kernel each projection shape runs per row bucket with the GB/s it streamed when it was
chosen, and each registry model's bandwidth bound: bf16 weight bytes one decode step reads
over the read bandwidth — the ceiling of plain decoding at batch 1 (int4 reads about a
quarter of those bytes).
"""

from __future__ import annotations

import json

import torch

from specdec.host import SHARED_CORES_SCALING, arithmetic, read_bandwidth_gbs
from specdec.models.config import ModelConfig


def decode_bytes(cfg: ModelConfig, bytes_per_weight: float = 2.0) -> int:
    """Weight bytes of one decode step: every projection and the vocabulary head (the
    embedding table is a lookup: one row)."""
    q = cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    head = cfg.vocab_size * cfg.hidden_size
    return int((cfg.num_layers * (attention + mlp) + head) * bytes_per_weight)


def _source(entry: dict) -> str:
    """Whether a kernel cache entry was measured here or predicted for this CPU
    (`kernel_plans`; a later load measures it, budget permitting)."""
    return "predicted" if entry.get("predicted") else "measured"


def kernel_rows(cache: dict) -> list[dict]:
    """One row per projection shape: the kernel per bucket, whether that plan was measured
    or predicted, and (measured) its GB/s at 1 and 8 rows."""
    rows = []
    for group, entry in cache.get("groups", {}).items():
        gbs = {}
        for bucket in ("1", "8") if "seconds" in entry else ():
            seconds = entry["seconds"][bucket][entry["plan"][bucket]]
            gbs[bucket] = round(entry["bytes"] / seconds / 1e9, 1)
        rows.append({"shape": group, "plan": entry["plan"], "source": _source(entry), "gb_s": gbs})
    return rows


def stack_rows(cache: dict) -> list[dict]:
    """One row per model shape with a native decode stack: the buckets it takes, and
    whether that was measured (whole passes both ways) or predicted."""
    return [
        {
            "model": key,
            "stack": [b for b, way in entry["plan"].items() if way == "stack"],
            "source": _source(entry),
        }
        for key, entry in cache.get("stacks", {}).items()
    ]


def tile_layout_rows(cache: dict) -> list[dict]:
    """One row per tiled int4 group: whether it keeps the tile layout, measured or not."""
    return [
        {"shape": key, "tiles": entry["tiles"], "source": _source(entry)}
        for key, entry in cache.get("tile_layout", {}).items()
    ]


def tile_prefetch_row(cache: dict) -> dict | None:
    """The int4 tile layout's prefetch level chosen here and its GB/s at 1 and 4 rows at each
    level (`tuning.tune_prefetch`), or None before an int4 target has loaded."""
    entry = cache.get("tile_prefetch")
    if not entry:
        return None
    return {"level": entry["level"], "source": _source(entry), "gb_s": _gb_s(entry)}


def _gb_s(entry: dict) -> dict:
    """{setting: {rows: GB/s}} of a timing entry's {setting: {rows: seconds}} sweeps of
    `entry["bytes"]` weight bytes (`tuning`'s prefetch and panel layout timings)."""
    return {
        name: {rows: round(entry["bytes"] / s / 1e9, 1) for rows, s in by_rows.items()}
        for name, by_rows in entry.get("seconds", {}).items()
    }


def bf16_panels_row(cache: dict) -> dict | None:
    """The bf16 panel layout chosen here ("16x2": pairs of k, `vdpbf16ps`; "32x1": fp32
    FMAs) and each layout's GB/s at 1, 4 and 8 rows (`tuning.tune_bf16_panels`),
    or None where the build reads one layout or no bf16 model has loaded yet."""
    entry = cache.get("bf16_panels")
    if not entry:
        return None
    layout = "{}x{}".format(*entry["layout"])
    return {"layout": layout, "source": _source(entry), "gb_s": _gb_s(entry)}


def resident_gb(cfg: ModelConfig) -> dict[str, float]:
    """What the model holds loaded on this CPU, per way it runs (`footprint`): the figure
    the memory guard compares with what is available."""
    from specdec.models.footprint import resident_estimate

    ways = {"int4": (torch.bfloat16, "int4"), "bf16": (torch.bfloat16, "none")}
    return {w: round(resident_estimate(cfg, d, q) / 1e9, 2) for w, (d, q) in ways.items()}


def report(bandwidth_gib: float = 1.0) -> dict:
    from specdec.hub import REGISTRY, cache_root
    from specdec.kernels import native
    from specdec.kernels.kernel_plans import isa_class
    from specdec.kernels.tuning import kernel_cache, machine
    from specdec.kernels.tuning_budget import budget_s

    bandwidth = read_bandwidth_gbs(bandwidth_gib)
    compute = arithmetic(torch.get_num_threads())
    cache = kernel_cache()
    try:
        stored = json.loads(cache.read_text())
    except (OSError, ValueError):
        stored = {}
    kernels = kernel_rows(stored)
    models = []
    for name in REGISTRY:
        directory = cache_root() / "models" / name / "bf16"
        try:
            cfg = ModelConfig.from_dir(directory)
        except Exception:  # not pulled yet, or not a supported architecture
            models.append({"model": name, "pulled": False})
            continue
        weight_bytes = decode_bytes(cfg)
        models.append(
            {
                "model": name,
                "pulled": True,
                "bf16_gb_per_token": round(weight_bytes / 1e9, 3),
                "bf16_bound_tok_s": round(bandwidth * 1e9 / weight_bytes, 1),
                "resident_gb": resident_gb(cfg),
            }
        )
    return {
        "machine": machine(),
        "read_bandwidth_gb_s": round(bandwidth, 1),
        "arithmetic": compute,
        "native_kernel": native.bf16_gemv() is not None,
        "kernel_cache": str(cache),
        "kernels": kernels,
        "plan_class": isa_class(),  # the rules a group nothing measured follows
        "tune_budget_s": budget_s(),
        "decode_stacks": stack_rows(stored),
        "int4_tile_layout": tile_layout_rows(stored),
        "int4_tile_prefetch": tile_prefetch_row(stored),
        "bf16_panels": bf16_panels_row(stored),
        "models": models,
    }


def print_report(data: dict) -> None:
    m = data["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} threads")
    print(f"read bandwidth: {data['read_bandwidth_gb_s']} GB/s")
    compute = data.get("arithmetic")
    if compute:
        print(
            f"fp32 matmul: {compute['one_thread_gflops']} GFLOP/s on 1 thread, "
            f"{compute['all_threads_gflops']} on {compute['threads']} ({compute['scaling']}x)"
        )
        if compute["threads"] > 1 and compute["scaling"] < SHARED_CORES_SCALING:
            print(
                "  the threads share cores at the moment (a VM's vCPUs on one core's hardware "
                "threads?): verify passes of several rows cost more while they do"
            )
    print(f"native bf16 kernel: {'built' if data['native_kernel'] else 'unavailable'}")
    print(f"kernel plans ({data['kernel_cache']}):")
    budget = data.get("tune_budget_s", 0)
    if not data["kernels"]:
        print(
            f"  none yet: a first load takes the plans predicted for {data.get('plan_class')} "
            f"CPUs and measures the uncertain ones within {budget:.0f} s"
        )
    for row in data["kernels"]:
        plan = " ".join(f"{b}:{k}" for b, k in row["plan"].items())
        gbs = row["gb_s"]
        timed = f"{gbs['1']:5} GB/s @1 row, {gbs['8']:5} @8" if gbs else "predicted, untimed"
        print(f"  {row['shape']:36} {timed:28} {row.get('source', 'measured'):9} [{plan}]")
    if any(row.get("source") == "predicted" for row in data["kernels"]):
        print(
            f"  predicted plans follow the rules for {data.get('plan_class')} CPUs; the next "
            f"loads measure them within their budget ({budget:.0f} s, SPECDEC_TUNE_BUDGET)"
        )
    for row in data.get("decode_stacks", []):
        most = max(map(int, row["stack"]), default=0)
        print(f"  decode stack of {row['model'][:48]}: up to {most} rows ({row['source']})")
    for row in data.get("int4_tile_layout", []):
        way = "tiles" if row["tiles"] else "rows"
        print(f"  int4 layout {row['shape']:36} {way} ({row['source']})")
    prefetch = data.get("int4_tile_prefetch")
    if prefetch:
        where = {0: "L1", 1: "L2"}
        timed = ", ".join(
            f"into {where[int(level)]} {gbs['1']} GB/s @1 row, {gbs['4']} @4"
            for level, gbs in prefetch["gb_s"].items()
        )
        timed = timed or prefetch.get("source", "measured")
        print(f"int4 tile layout prefetches into {where[prefetch['level']]} ({timed})")
    panels = data.get("bf16_panels")
    if panels:
        timed = ", ".join(
            f"{name} {gbs['1']} / {gbs['4']} / {gbs['8']}" for name, gbs in panels["gb_s"].items()
        )
        if timed:
            print(f"bf16 panels: {panels['layout']} (GB/s at 1 / 4 / 8 rows: {timed})")
        else:
            print(f"bf16 panels: {panels['layout']} (predicted)")
    print("bandwidth bound of plain bf16 decoding, batch 1:")
    for row in data["models"]:
        if row["pulled"]:
            print(
                f"  {row['model']:32} {row['bf16_gb_per_token']:.3f} GB/token -> "
                f"{row['bf16_bound_tok_s']} tok/s"
            )
        else:
            print(f"  {row['model']:32} not pulled (specdec models pull {row['model']})")
    pulled = [row for row in data["models"] if row.get("resident_gb")]
    if pulled:
        print("resident memory once loaded (what the load guard checks against what is free):")
        for row in pulled:
            gb = row["resident_gb"]
            print(f"  {row['model']:32} int4 {gb['int4']:.2f} GB, bf16 {gb['bf16']:.2f} GB")
