"""The PNG plots of a benchmark folder (matplotlib, Agg: no display needed).

Each function takes the "ok" rows (and costs) and writes one file; a plot with nothing to
show is not written, so a partial run still plots what it has.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SPEC_FOR_SWEEP = "draft-auto"  # the method the erosion plot follows


def _label(row: dict, mean: bool = True) -> str:
    """`mean`: the mean prompt length of a natural workload (it differs by batch size,
    whose prompt sets differ, so lines across batch sizes leave it out)."""
    if row["prompt_len"] is None:
        if not mean:
            return f"{row['workload']} (own prompts)"
        return f"{row['workload']} (~{row['prompt_tokens_mean']:.0f} tok)"
    return f"{row['workload']} {row['prompt_len']} tok"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_vs_batch(
    rows: list[dict], out: Path, method: str = SPEC_FOR_SWEEP, field: str = "speedup"
) -> Path | None:
    """The erosion plot: speedup over plain vs batch size, one line per prompt length
    (`field` "cpu_speedup" for a one-thread run on a shared machine)."""
    temps = sorted({r["temperature"] for r in rows if r["method"] == method})
    if not temps:
        return None
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps, strict=True):
        lines = defaultdict(list)
        for r in rows:
            if r["method"] == method and r["temperature"] == temp and r.get(field):
                lines[_label(r, mean=False)].append((r["batch"], r[field]))
        for label, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        clock = "CPU time" if field == "cpu_speedup" else "tok/s"
        ax.set_ylabel(f"{method} speedup over plain ({clock})")
        ax.set_title(f"temperature {temp:g}")
        ax.legend(fontsize=8)
    return _save(fig, out / "speedup_vs_batch.png")


def tokens_per_s_by_method(rows: list[dict], out: Path) -> Path | None:
    """Grouped bars: tokens/s of every method, one panel per batch size (greedy, or the
    lowest temperature measured)."""
    if not rows:
        return None
    temp = min(r["temperature"] for r in rows)
    rows = [r for r in rows if r["temperature"] == temp]
    batches = sorted({r["batch"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(
        len(batches),
        1,
        figsize=(max(6, 1.2 * len(methods) * 2), 3.2 * len(batches)),
        squeeze=False,
    )
    width = 0.8 / len(methods)
    for ax, batch in zip(axes[:, 0], batches, strict=True):
        labels = list(dict.fromkeys(_label(r) for r in rows if r["batch"] == batch))
        for j, method in enumerate(methods):
            values = {
                _label(r): r["tokens_per_s"]
                for r in rows
                if r["batch"] == batch and r["method"] == method
            }
            xs = [i + j * width for i, lab in enumerate(labels) if lab in values]
            ax.bar(xs, [values[lab] for lab in labels if lab in values], width, label=method)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, fontsize=8)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"batch {batch}, temperature {temp:g}")
    axes[0, 0].legend(fontsize=7, ncol=min(len(methods), 5))
    return _save(fig, out / "tokens_per_s.png")


def acceptance_by_position(rows: list[dict], out: Path) -> Path | None:
    """P(draft token i kept | drafted), per speculative method and workload, at the
    smallest batch size measured (acceptance does not depend on batching)."""
    spec = [r for r in rows if r.get("acceptance_per_position")]
    if not spec:
        return None
    batch = min(r["batch"] for r in spec)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in spec:
        if r["batch"] != batch:
            continue
        ys = r["acceptance_per_position"]
        style = "-" if r["temperature"] == 0 else ":"
        label = f"{r['method']}, {_label(r)}, T={r['temperature']:g}"
        ax.plot(range(1, len(ys) + 1), ys, style, marker=".", label=label)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (kept / drafted)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"acceptance by position, batch {batch}")
    ax.legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, out / "acceptance_by_position.png")


def predicted_vs_measured(rows: list[dict], out: Path) -> Path | None:
    """Cost-model prediction against the measured decode-phase speedup, with the +-15%
    band it is held to."""
    pts = [r for r in rows if r.get("predicted_speedup") and r.get("decode_speedup")]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 5))
    for i, batch in enumerate(sorted({r["batch"] for r in pts})):
        sel = [r for r in pts if r["batch"] == batch]
        color = f"C{i}"
        ax.scatter(
            [r["decode_speedup"] for r in sel],
            [r["predicted_speedup"] for r in sel],
            label=f"batch {batch}, decode phase (wall)",
            s=18,
            color=color,
        )
        cpu = [r for r in sel if r.get("cpu_speedup")]
        ax.scatter(
            [r["cpu_speedup"] for r in cpu],
            [r["predicted_speedup"] for r in cpu],
            label=f"batch {batch}, end to end (CPU time)",
            s=28,
            marker="x",
            color=color,
        )
    hi = (
        max(
            max(r["decode_speedup"], r["predicted_speedup"], r.get("cpu_speedup") or 0) for r in pts
        )
        * 1.1
    )
    xs = [0, hi]
    ax.plot(xs, xs, color="black", lw=0.8)
    ax.fill_between(
        xs,
        [0.85 * x for x in xs],
        [1.15 * x for x in xs],
        color="grey",
        alpha=0.2,
        label="within 15%",
    )
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured speedup")
    ax.set_ylabel("predicted speedup (cost model)")
    ax.legend(fontsize=8)
    return _save(fig, out / "predicted_vs_measured.png")


def verify_cost_curve(costs: dict, out: Path) -> Path | None:
    """v(k): a target pass over k+1 tokens per row relative to one token, per batch size
    and context, with the draft step's relative cost c in the legend."""
    if not costs:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for entry in sorted(costs.values(), key=lambda e: (e["rows"], e["context"])):
        ks = sorted(int(k) for k in entry["v"])
        label = f"batch {entry['rows']}, context {entry['context']} (c = {entry['c']:.2f})"
        ax.plot(ks, [entry["v"][str(k)] for k in ks], marker="o", ms=3, label=label)
    ax.set_xlabel("k (draft tokens verified per row)")
    ax.set_ylabel("verify cost v(k) = pass of k+1 tokens / 1 token")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _save(fig, out / "verify_cost.png")


def write_all(rows: list[dict], costs: dict, out: Path, cpu_clock: bool = False) -> list[Path]:
    """`cpu_clock`: a one-thread run, whose CPU-time speedups are the robust ones."""
    made = [
        speedup_vs_batch(rows, out, field="cpu_speedup" if cpu_clock else "speedup"),
        tokens_per_s_by_method(rows, out),
        acceptance_by_position(rows, out),
        predicted_vs_measured(rows, out),
        verify_cost_curve(costs, out),
    ]
    return [p for p in made if p is not None]
