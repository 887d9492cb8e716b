"""Logits -> probabilities -> tokens, with per-row parameters and per-request generators.

The same `probs_from_logits` transform is applied to target and draft logits, so an
acceptor compares the distributions the user actually asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.params import SamplingParams


def probs_from_logits(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N]; 0 = greedy
    top_k: torch.Tensor,  # [N] long; 0 = off
    top_p: torch.Tensor,  # [N]; 1 = off
) -> torch.Tensor:  # [N, V] float32, rows sum to 1; greedy rows are one-hot at the argmax
    """Temperature, then top-k, then top-p on the renormalised top-k distribution."""
    greedy = temperature == 0
    if bool(greedy.all()):  # the one-hot rows alone: no softmax over the vocabulary
        return torch.zeros_like(logits).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    filter_k = bool((top_k > 0).any())
    filter_p = bool((top_p < 1).any())
    if filter_k or filter_p:
        scaled = _filter_sorted(scaled, top_k, top_p, filter_k, filter_p)
    probs = torch.softmax(scaled, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def _filter_sorted(scaled, top_k, top_p, filter_k: bool, filter_p: bool) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf (one sort serves both filters)."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = scaled.shape[-1]
    ranks = torch.arange(vocab, device=scaled.device)
    if filter_k:
        k = torch.where(top_k > 0, top_k, vocab)
        sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
    if filter_p:
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive cumsum
        # Drop a token once the ones ranked above it already reach top_p; rank 0 always stays.
        drop = (mass_before >= top_p[:, None]) & (ranks[None, :] > 0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(1, order, sorted_logits)


def sample(
    probs: torch.Tensor,  # [N, V]
    generators: Sequence[torch.Generator | None],  # one per row
    greedy: Sequence[bool] | None = None,  # rows to take the argmax of; None = sample all
) -> torch.Tensor:  # [N] long
    """Draw one token per row from that row's own generator (argmax for greedy rows), so a
    request's output depends on its seed, not on which other requests share the batch.

    A row whose distribution is a point mass (a greedy request's one-hot p, top-k 1) takes
    its argmax without a draw: the same token, without a pass over the vocabulary (one host
    sync for the whole batch decides it)."""
    top, best = probs.max(-1)  # [N], [N]
    certain = (top == 1.0).tolist()
    rows = [
        best[i : i + 1]
        if certain[i] or (greedy is not None and greedy[i])
        else draw(probs[i], generators[i])
        for i in range(probs.shape[0])
    ]
    return torch.cat(rows)


def draw(
    probs: torch.Tensor,  # [V], not necessarily normalised
    generator: torch.Generator | None,
) -> torch.Tensor:  # [1] long
    """One token drawn from `probs` by inverting its cumulative sum, kept in float64 so
    every fp32 probability counts in full and a token of probability 0 is never drawn
    (`right=True` skips the flat steps it leaves in the CDF). On a CPU this is 14-17x faster
    than `torch.multinomial`, which took 1.2 ms over SmolLM2's 49k vocabulary and 3.5 ms
    over Qwen's 152k: a tenth of an int4 1.5B decode step, for every sampled row."""
    cdf = probs.double().cumsum(0)
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=probs.device)
    return torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=probs.numel() - 1)


def param_tensors(
    params: Sequence[SamplingParams], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """temperature, top_k, top_p as `[N]` tensors for `probs_from_logits`."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.long)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    return temperature.to(device), top_k.to(device), top_p.to(device)


def request_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's request transform applied at every position: `[B, T, V]` -> `[B, T, V]`
    (row b under `params[b]`)."""
    B, T, V = logits.shape
    temperature, top_k, top_p = param_tensors(params, logits.device)
    flat = probs_from_logits(
        logits.reshape(B * T, V),
        temperature.repeat_interleave(T),
        top_k.repeat_interleave(T),
        top_p.repeat_interleave(T),
    )
    return flat.view(B, T, V)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's private generator; seeded from the OS when the user gave no seed."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
