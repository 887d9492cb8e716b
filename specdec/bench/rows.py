"""A benchmark point's result row: its rates, latencies and acceptance (or why it was
skipped), and the host's arithmetic when it finished."""

from __future__ import annotations

import hashlib
import math
import statistics

import torch

from specdec.bench.plan import Point
from specdec.host import arithmetic
from specdec.stats import SpecStats


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: with 4 requests p90 is the slowest)."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def output_digest(token_ids: list[list[int]]) -> str:
    return hashlib.sha1(repr(token_ids).encode()).hexdigest()[:12]


def result_row(
    point: Point,
    prompts,
    token_ids,
    stats: list[SpecStats] | None,
    wall: float,
    prefill_s: float = 0.0,
    tp: int = 1,
) -> dict:
    """A run's row: its rates, latencies and acceptance, and the point it ran."""
    generated = sum(len(t) for t in token_ids)
    row = {
        "key": point.key,
        "group": point.group,
        "cost_key": point.cost_key,
        "workload": point.workload,
        "prompt_len": point.prompt_len,
        "prompt_tokens_mean": round(statistics.mean(len(p) for p in prompts), 1),
        "batch": point.batch,
        "temperature": point.temperature,
        "method": point.method,
        "window": point.window,
        "tp": tp,
        "status": "ok",
        "requests": len(prompts),
        "generated_tokens": generated,
        "wall_s": round(wall, 4),
        "tokens_per_s": round(generated / wall, 4),
        "output_digest": output_digest(token_ids),
        "token_ids": token_ids,
    }
    if stats:
        tpot = [s.tpot_s for s in stats if s.generated > 1]
        ttft = [s.ttft_s for s in stats]
        total = sum(stats, SpecStats())
        # Decode phase alone: the wall time less the engine's prefills, over the tokens
        # after each request's first. A round's requests all arrive at its start, so a
        # TTFT is the round's prefill (no request queues behind another's decoding).
        row |= {
            "decode_tokens_per_s": round_or_none(
                decode_rate(generated, len(prompts), wall, prefill_s), 4
            ),
            "tpot_median_s": round(statistics.median(tpot), 5) if tpot else None,
            "tpot_p90_s": round_or_none(percentile(tpot, 0.9), 5),
            "ttft_median_s": round(statistics.median(ttft), 4),
            "ttft_p90_s": round_or_none(percentile(ttft, 0.9), 4),
            "steps": total.steps,
            "drafted_tokens": total.drafted,
            "accepted_tokens": total.accepted,
            "acceptance_rate": round(total.acceptance_rate, 4) if total.drafted else None,
            "mean_accepted_length": round(total.mean_accepted_length, 4),
            "acceptance_per_position": [round(a, 4) for a in total.acceptance_per_position],
        }
    return row


def round_or_none(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def decode_rate(generated: int, requests: int, wall: float, prefill_s: float) -> float | None:
    """Tokens/s of a run's decode phase: the tokens after each request's first over the
    wall time less the prefills (None when nothing is left of the wall time)."""
    decode_s = wall - prefill_s
    return (generated - requests) / decode_s if decode_s > 0 else None


def skipped_row(point: Point, reason: str, tp: int = 1) -> dict:
    """A point that was planned but cannot run here; kept so a resumed run skips it too."""
    return {
        "key": point.key,
        "group": point.group,
        "workload": point.workload,
        "prompt_len": point.prompt_len,
        "batch": point.batch,
        "temperature": point.temperature,
        "method": point.method,
        "window": point.window,
        "tp": tp,
        "status": "skipped",
        "reason": reason,
    }


def threads_scaling() -> float | None:
    """fp32 arithmetic on all of torch's threads over one (`host.arithmetic`, 0.2 s),
    or None with one thread."""
    threads = torch.get_num_threads()
    return arithmetic(threads, seconds=0.1)["scaling"] if threads > 1 else None
