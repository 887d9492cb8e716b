"""summary.md: the tables of a benchmark folder, in the form of docs/benchmarks.md's tables.

Also states the two checks in words, with the points that fail them, so a reader
does not have to scan the table: `auto` at or above 0.97x plain everywhere, and predicted
vs measured within 15% at batch 1.
"""

from __future__ import annotations

import platform
from pathlib import Path

import psutil
import torch

AUTO_FLOOR = 0.97  # "speculation never hurts", within noise
PREDICTION_TOLERANCE = 0.15


def machine_description(device: str, tp: int = 1) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = (
        f"{cpu}, {psutil.cpu_count()} logical CPUs, {psutil.virtual_memory().total / 2**30:.0f} "
        f"GiB RAM, torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )
    if device.startswith("cuda") and torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name(0)}"
    if tp > 1:
        backend = "NCCL" if device.startswith("cuda") else "gloo"
        text += f"; tensor parallel: {tp} processes ({backend}), the threads are per process"
    return text


def _f(x, fmt: str = "{:.2f}", none: str = "") -> str:
    return none if x is None else fmt.format(x)


def _ms(x) -> str:
    return _f(None if x is None else x * 1000, "{:.0f}")


def _prompt(r: dict) -> str:
    return "natural" if r["prompt_len"] is None else str(r["prompt_len"])


def results_table(rows: list[dict], price: bool) -> list[str]:
    head = (
        "| workload | prompt | mean prompt tok | batch | T | method | tok/s | speedup | "
        "decode speedup | CPU-time speedup | predicted | TPOT med / p90 (ms) | TTFT med (ms) | "
        "acceptance | tokens / pass | same as plain | load | threads |"
    )
    head += " $ / M tok |" if price else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        predicted = _f(r.get("predicted_speedup"), "{:.2f}x")
        if r.get("predicted_best_k") is not None:
            predicted += f" (k={r['predicted_best_k']})"
        tpot = f"{_ms(r.get('tpot_median_s'))} / {_ms(r.get('tpot_p90_s'))}"
        line = (
            f"| {r['workload']} | {_prompt(r)} | {r['prompt_tokens_mean']:.0f} | {r['batch']} | "
            f"{r['temperature']:g} | {r['method']} | {r['tokens_per_s']:.2f} | "
            f"{_f(r.get('speedup'), '{:.2f}x')} | {_f(r.get('decode_speedup'), '{:.2f}x')} | "
            f"{_f(r.get('cpu_speedup'), '{:.2f}x')} | "
            f"{predicted} | {tpot if r.get('tpot_median_s') is not None else ''} | "
            f"{_ms(r.get('ttft_median_s'))} | {_f(r.get('acceptance_rate'), '{:.3f}')} | "
            f"{_f(r.get('mean_accepted_length'))} | "
            f"{_f(r.get('same_output_as_plain'), '{:.2f}')} | {_f(r.get('load_1m'), '{:.1f}')} | "
            f"{_f(r.get('threads_scaling'), '{:.2f}x')} |"
        )
        line += f" {_f(r.get('cost_per_million_tokens'), '{:.3f}')} |" if price else ""
        lines.append(line)
    return lines


def erosion_table(
    rows: list[dict], method: str = "draft-auto", field: str = "speedup"
) -> list[str]:
    """Rows: workload and prompt length; columns: batch sizes; cells: speedup of `method`
    (`field`: "speedup" in tokens/s or "cpu_speedup" in tokens per CPU second)."""
    sel = [r for r in rows if r["method"] == method and r.get(field) is not None]
    if not sel:
        return []
    out = []
    for temp in sorted({r["temperature"] for r in sel}):
        at = [r for r in sel if r["temperature"] == temp]
        batches = sorted({r["batch"] for r in at})
        out += [
            f"`{method}` speedup over plain "
            f"({'tokens per CPU second' if field == 'cpu_speedup' else 'tokens/s'}), "
            f"temperature {temp:g}:",
            "",
            "| workload | prompt | " + " | ".join(f"batch {b}" for b in batches) + " |",
            "|---|---|" + "---|" * len(batches),
        ]
        for workload, length in dict.fromkeys((r["workload"], _prompt(r)) for r in at):
            cells = {
                r["batch"]: r[field]
                for r in at
                if r["workload"] == workload and _prompt(r) == length
            }
            out.append(
                f"| {workload} | {length} | "
                + " | ".join(_f(cells.get(b), "{:.2f}x") for b in batches)
                + " |"
            )
        out.append("")
    return out


def costs_table(costs: dict) -> list[str]:
    if not costs:
        return []
    ks = sorted({int(k) for e in costs.values() for k in e["v"]})
    out = [
        "| batch | context | target step (ms) | c (draft step / target step) | "
        + " | ".join(f"v({k})" for k in ks)
        + " |",
        "|---|---|---|---|" + "---|" * len(ks),
    ]
    for entry in sorted(costs.values(), key=lambda e: (e["rows"], e["context"])):
        v = entry["v"]
        out.append(
            f"| {entry['rows']} | {entry['context']} | {entry['verify_s']['0'] * 1000:.1f} | "
            f"{entry['c']:.3f} | " + " | ".join(_f(v.get(str(k))) for k in ks) + " |"
        )
    return out


def _is_auto(row: dict) -> bool:
    """An `auto` method's row (`-auto` and `-auto-warm`; rows written before the window was
    recorded, by their method's name)."""
    return row.get("window", "auto" if row["method"].endswith("-auto") else None) == "auto"


# The per-turn figure a floor check prefers where the methods took turns.
PAIRED = {"speedup": "paired_speedup", "cpu_speedup": "paired_cpu_speedup"}


def _floor_check(rows: list[dict], field: str, what: str) -> str:
    """`auto` against the floor on `field`; on tokens/s and tokens per CPU second, per
    turn where methods took turns (`paired_speedup`, `paired_cpu_speedup`: drift on a
    shared CPU cancels within a turn)."""
    paired_field = PAIRED.get(field)

    def value(r: dict) -> float | None:
        paired = r.get(paired_field) if paired_field else None
        return paired if paired is not None else r.get(field)

    auto = [r for r in rows if _is_auto(r) and value(r) is not None]
    slow = [r for r in auto if value(r) < AUTO_FLOOR]
    paired = sum(paired_field is not None and r.get(paired_field) is not None for r in auto)
    how = f"; {paired} of {len(auto)} as medians of per-turn ratios" if paired else ""
    verdict = (
        f"**yes** at all {len(auto)} points"
        if not slow
        else f"**no** at {len(slow)} of {len(auto)} points: "
        + "; ".join(f"{r['method']} {r['group']} {value(r):.2f}x" for r in slow)
    )
    return f"- `auto` at or above {AUTO_FLOOR}x plain decoding ({what}{how}): {verdict}"


def _interval_check(rows: list[dict]) -> str | None:
    """`auto` against the floor by its per-request 95% interval's lower bound (None where
    no `auto` row has an interval)."""
    auto = [r for r in rows if _is_auto(r) and r.get("request_speedup_low") is not None]
    if not auto:
        return None
    figures = "; ".join(
        f"{r['method']} {r['group']} {r['request_speedup']:.3f}x "
        f"({r['request_speedup_low']:.3f}-{r['request_speedup_high']:.3f})"
        for r in auto
    )
    slow = sum(r["request_speedup_low"] < AUTO_FLOOR for r in auto)
    verdict = f"**no** at {slow} of {len(auto)} points" if slow else f"**yes** at all {len(auto)}"
    return (
        f"- `auto`'s 95% interval over requests paired with plain's in the same turn above "
        f"{AUTO_FLOOR}x: {verdict} ({figures})"
    )


def checks(rows: list[dict]) -> list[str]:
    out = [_floor_check(rows, "speedup", "tokens/s, wall time")]
    if interval := _interval_check(rows):
        out.append(interval)
    if any(r.get("paired_decode_speedup") is not None for r in rows):
        out.append(
            _floor_check(
                rows, "paired_decode_speedup", "decode phase alone, medians of per-turn ratios"
            )
        )
    if any(r.get("cpu_speedup") is not None for r in rows):
        out.append(_floor_check(rows, "cpu_speedup", "tokens per CPU second"))
    out.append(
        f"- predicted vs measured (decode phase) within {PREDICTION_TOLERANCE:.0%} at batch 1: "
        + _prediction_verdict(rows)
    )
    cpu = [
        r for r in rows if r["batch"] == 1 and r.get("predicted_speedup") and r.get("cpu_speedup")
    ]
    if cpu:
        within = [
            r
            for r in cpu
            if abs(r["predicted_speedup"] / r["cpu_speedup"] - 1) <= PREDICTION_TOLERANCE
        ]
        ratios = sorted(r["predicted_speedup"] / r["cpu_speedup"] for r in cpu)
        out.append(
            f"- predicted vs measured in CPU time (end to end) at batch 1: within "
            f"{PREDICTION_TOLERANCE:.0%} at {len(within)} of {len(cpu)} points; predicted / "
            f"measured from {ratios[0]:.2f} to {ratios[-1]:.2f} (median "
            f"{ratios[len(ratios) // 2]:.2f})"
        )
    return out


def _prediction_verdict(rows: list[dict]) -> str:
    """Whether the cost model's predictions at batch 1 came within the tolerance of the
    decode phase measured; a point without a verify curve (`--curve-ks 0`) has none."""
    b1 = [r for r in rows if r["batch"] == 1 and r.get("decode_speedup")]
    priced = [r for r in b1 if r.get("predicted_speedup")]
    if not priced:
        if any(r.get("window") not in (None, "tree") for r in b1):
            return (
                "not checked: no point at batch 1 has a verify curve of two or more widths "
                "(`--curve-ks`) to predict from"
            )
        return "no speculative point at batch 1"
    off = [
        r
        for r in priced
        if abs(r["predicted_speedup"] / r["decode_speedup"] - 1) > PREDICTION_TOLERANCE
    ]
    if not off:
        return f"**yes** at all {len(priced)} points"
    return f"**no** at {len(off)} of {len(priced)} points: " + "; ".join(
        f"{r['method']} {r['group']} predicted {r['predicted_speedup']:.2f}x, "
        f"measured {r['decode_speedup']:.2f}x"
        for r in off
    )


def best_k_table(best: dict) -> list[str]:
    if not best:
        return []
    out = [
        "| group | best fixed k measured | its speedup | best k predicted | predicted speedup |",
        "|---|---|---|---|---|",
    ]
    for group, b in best.items():
        out.append(
            f"| {group} | {b['measured_best_k']} | {_f(b['measured_best_speedup'], '{:.2f}x')} | "
            f"{_f(b['predicted_best_k'], '{}')} | {_f(b['predicted_best_speedup'], '{:.2f}x')} |"
        )
    return out


def _tp_line(config: dict) -> list[str]:
    draft = "sharded like the target" if config.get("draft_tp", 1) > 1 else "whole on every rank"
    return [
        f"**Tensor parallel:** tp = {config['tp']} ranks under torchrun, draft {draft}; "
        "costs and speedups are in wall time only (a rank waiting on a collective uses no "
        "CPU, so CPU time is not what a step costs).  "
    ]


def _draft_head(data: dict) -> str:
    """` (head: ...)`: what the draft model's vocabulary head scored, where recorded."""
    head = data.get("draft_head")
    return f" (its vocabulary head: {head})" if head else ""


def write_summary(
    out: Path, data: dict, rows: list[dict], skipped: list[dict], best: dict, plots: list[Path]
) -> Path:
    config = data["config"]
    price = any(r.get("cost_per_million_tokens") is not None for r in rows)
    lines = [
        "# Benchmark summary",
        "",
        f"**Machine:** {data.get('machine', '?')}  ",
        f"**Target:** {config['model']}, **draft:** {config['draft']}"
        f"{_draft_head(data)}, {config['dtype']} on "
        f"{config['device']}; up to {config['max_tokens']} new tokens per request"
        f"{' (ignore EOS)' if config.get('ignore_eos') else ' (stopping at EOS)'}, "
        f"`auto` windows up to k = {config['k_max']}.  ",
        *(_tp_line(config) if config.get("tp") else []),
        f"**Command:** `{data.get('command', '')}`",
        *(["", f"**Prompts:** {data['sharegpt']}.", ""] if data.get("sharegpt") else [""]),
        "tok/s: generated tokens over the wall time of the whole point (prefill included); "
        "speedup: over plain decoding of the same prompts; decode speedup: the same without "
        "the prefill, which is what the cost model predicts; CPU-time speedup: end to end in "
        "this process's CPU seconds (with --threads 1, what a quiet machine would show); "
        "load: the machine's 1-minute "
        "load average when the point finished (above the CPU count, other processes were "
        "sharing the cores); threads: fp32 arithmetic on all threads over one when the point "
        "finished (under 1.4x the threads shared cores, as a VM's vCPUs on one core's hardware "
        "threads do; verify passes of many rows are slower then).",
        "",
        "## Checks",
        "",
        *checks(rows),
        "",
        "## Speedup by batch size and prompt length",
        "",
        *erosion_table(rows),
        *(
            erosion_table(rows, field="cpu_speedup")
            if config.get("threads") == 1 and not config.get("tp")
            else []
        ),
        "## All points",
        "",
        *results_table(rows, price),
        "",
        "## Cost model",
        "",
        "Measured verify cost v(k) (a pass of k+1 tokens per row over one token) and draft "
        "step cost c, per batch size and context:",
        "",
        *costs_table(data.get("costs", {})),
        "",
        *best_k_table(best),
        "",
    ]
    if skipped:
        lines += ["## Skipped", ""]
        reasons = dict.fromkeys(f"- {r['method']}: {r['reason']}" for r in skipped)
        lines += [*reasons, ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    return path
