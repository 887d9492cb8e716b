"""Shared by the A/B scripts here: whole `generate` calls of several arms taking turns."""

import statistics
import time

import torch

from specdec import sampling


def in_turn(arms: dict, prompts, params, repeats: int) -> dict[str, float]:
    """{arm: median tokens/s}: each repeat runs every arm once, in order, so a neighbour's
    busy spell slows them alike. An arm is a callable (prompts, params) -> outputs, run
    once first to warm up."""
    tokens = len(prompts) * params.max_tokens  # ignore_eos: every request runs to the end
    for run in arms.values():
        run(prompts, params)
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, run in arms.items():
            start = time.perf_counter()
            run(prompts, params)
            rates[name].append(tokens / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


def with_draw(draw, generate):
    """`generate` with `draw` as the sampler's per-row draw (`sampling.sample` looks
    `sampling.draw` up at each call)."""

    def run(prompts, params):
        sampling.draw = draw
        return generate(prompts, params)

    return run


def multinomial(probs, generator):
    """The draw `sampling.draw` replaced: torch.multinomial."""
    return torch.multinomial(probs, 1, generator=generator)
