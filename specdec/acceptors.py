"""Token acceptors: given a draft and the target's distributions, which tokens to keep.

The contract (docs/design/contracts.md) that every acceptor, built-in or user-written, follows:

    acceptor(draft, target_probs, generators) -> Verdict

- `draft.tokens [B, k]` are the proposed tokens; `draft.probs [B, k, V]` the drafter's
  distribution q at each position after the request's temperature/top-k/top-p, or None for
  a deterministic drafter (q is then one-hot at the proposed token). `draft.lengths [B]`
  says how many of the k tokens each row really proposed; later ones must be rejected.
- `target_probs [B, k+1, V]` is the target's distribution p at each draft position plus one
  more, under the same transform.
- `generators` holds one `torch.Generator` per row: draw every random number of row b from
  `generators[b]` so a request's output depends on its seed only.
- The verdict says how many draft tokens each row keeps (`num_accepted [B]`) and the tokens
  it emits (`tokens [B, k+1]`): the accepted prefix plus exactly one token of the acceptor's
  own choosing, padded with -1. Every row emits at least one token.
- An acceptor is pure: it must not modify its inputs.

An acceptor that does not preserve the target distribution must say so: set the class
attribute `lossless = False` and carry "Lossy" in its name.

Writing your own (the CLI takes `--acceptor module:Class`):

    class AlwaysAcceptLossy:
        lossless = False
        def __call__(self, draft, target_probs, generators):
            B, k = draft.tokens.shape
            bonus = target_probs[:, k].argmax(-1, keepdim=True)
            return Verdict(torch.cat([draft.tokens, bonus], 1), draft.lengths.clone())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from specdec.sampling import sample
from specdec.types import Draft, Verdict


@runtime_checkable
class TokenAcceptor(Protocol):
    lossless: bool

    def __call__(
        self,
        draft: Draft,
        target_probs: torch.Tensor,
        generators: Sequence[torch.Generator],
    ) -> Verdict: ...


def _draft_token_probs(probs: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor:
    """q(d_i) at each proposed token `[B, k]` (1 for a deterministic drafter)."""
    if probs is None:
        return torch.ones(tokens.shape, dtype=torch.float32, device=tokens.device)
    return probs.gather(2, tokens[..., None])[..., 0]


def _first_rejection(accept: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Accepted prefix length `[B]` from per-position decisions `accept [B, k]`."""
    k = accept.shape[1]
    lengths = lengths.to(accept.device)  # Draft.lengths lives on the host
    in_draft = torch.arange(k, device=accept.device)[None, :] < lengths[:, None]
    return (accept & in_draft).long().cumprod(dim=1).sum(dim=1)


def _assemble(draft: Draft, num_accepted: torch.Tensor, last: torch.Tensor) -> Verdict:
    """Accepted prefix, then `last [B]` at index num_accepted, then -1."""
    B, k = draft.tokens.shape
    positions = torch.arange(k + 1, device=draft.tokens.device)[None, :]
    tokens = torch.cat([draft.tokens, draft.tokens.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(positions < num_accepted[:, None], tokens, -1)
    tokens.scatter_(1, num_accepted[:, None], last[:, None])
    return Verdict(tokens=tokens, num_accepted=num_accepted)


def _undrafted(emitted: torch.Tensor) -> Verdict:
    """The verdict of an empty draft (k = 0, a plain step): the one token `emitted [B]`.
    What `_assemble` builds from an empty draft, in two operators instead of a dozen (on
    a GPU each is a launch while the device waits: a plain step's host time)."""
    return Verdict(tokens=emitted[:, None], num_accepted=torch.zeros_like(emitted))


def _q_at(draft: Draft, index: torch.Tensor, vocab: int) -> torch.Tensor:
    """q at position `index [B]` as a dense `[B, V]` (one-hot for a deterministic draft)."""
    if draft.probs is not None:
        return draft.probs.gather(1, index[:, None, None].expand(-1, 1, vocab))[:, 0]
    token = draft.tokens.gather(1, index[:, None])
    return torch.zeros(len(index), vocab, device=token.device).scatter_(1, token, 1.0)


def _uniforms(k: int, generators: Sequence[torch.Generator], device) -> torch.Tensor:
    """`[B, k]` uniforms in [0, 1), row b from generators[b]."""
    return torch.stack([torch.rand(k, generator=g, device=device) for g in generators])


class RejectionSampler:
    """Modified rejection sampling (Leviathan et al. 2023, Chen et al. 2023): lossless.

    Draft token d_i is kept with probability min(1, p(d_i) / q(d_i)); at the first
    rejection a token is drawn from the residual norm(max(0, p - q)); if all are kept, a
    bonus token is drawn from p at position k. The emitted sequence is distributed exactly
    as the target's own samples.
    """

    lossless = True

    def __call__(self, draft, target_probs, generators) -> Verdict:
        B, k = draft.tokens.shape
        if k == 0:  # nothing to accept: a sample of p, as below with n = 0
            return _undrafted(sample(target_probs[:, 0], generators))
        device = target_probs.device
        p_draft = target_probs[:, :k].gather(2, draft.tokens[..., None])[..., 0]  # [B, k]
        q_draft = _draft_token_probs(draft.probs, draft.tokens)  # [B, k]
        u = _uniforms(k, generators, device) if k else target_probs.new_zeros(B, 0)
        accept = u * q_draft < p_draft  # u < p/q without dividing by q
        n = _first_rejection(accept, draft.lengths)  # [B]

        p_next = target_probs.gather(1, n[:, None, None].expand(-1, 1, target_probs.shape[2]))
        p_next = p_next[:, 0]  # [B, V]: p at the first rejected position (or the bonus one)
        rejected = n < draft.lengths.to(device)
        if k and bool(rejected.any()):
            q_next = _q_at(draft, n.clamp(max=k - 1), p_next.shape[1])  # [B, V]
            residual = (p_next - q_next).clamp_min(0)
            mass = residual.sum(-1, keepdim=True)
            # A zero residual only arises from rounding when p == q; p is then the answer.
            residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
            p_next = torch.where(rejected[:, None], residual, p_next)
        return _assemble(draft, n, sample(p_next, generators))


class GreedyAcceptor:
    """Keep draft tokens while they equal the target's argmax; then emit the argmax.

    Lossless for greedy decoding: the output is token for token what plain greedy
    decoding of the target produces. Uses no randomness.
    """

    lossless = True

    def __call__(self, draft, target_probs, generators) -> Verdict:
        k = draft.tokens.shape[1]
        if k == 0:
            return _undrafted(target_probs[:, 0].argmax(-1))
        best = target_probs.argmax(-1)  # [B, k+1]
        n = _first_rejection(draft.tokens == best[:, :k], draft.lengths)
        return _assemble(draft, n, best.gather(1, n[:, None])[:, 0])


class LossyTypicalAcceptor:
    """Typical acceptance (Medusa, Cai et al. 2024). LOSSY: does not preserve p.

    A draft token is kept when the target gives it probability above
    min(epsilon, delta * exp(-H(p))), where H is the entropy of p at that position: more
    draft tokens are kept where the target is unsure, which raises acceptance at the price
    of drifting from the target distribution. After the kept prefix the next token is
    sampled from p (argmax when the request is greedy, as p is then one-hot).
    """

    lossless = False

    def __init__(self, epsilon: float = 0.3, delta: float = 0.09) -> None:
        self.epsilon = epsilon
        self.delta = delta

    def __call__(self, draft, target_probs, generators) -> Verdict:
        k = draft.tokens.shape[1]
        p = target_probs[:, :k]
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [B, k]
        threshold = torch.minimum(
            torch.full_like(entropy, self.epsilon), self.delta * torch.exp(-entropy)
        )
        p_draft = p.gather(2, draft.tokens[..., None])[..., 0]
        n = _first_rejection(p_draft > threshold, draft.lengths)
        V = target_probs.shape[2]
        p_next = target_probs.gather(1, n[:, None, None].expand(-1, 1, V))[:, 0]
        return _assemble(draft, n, sample(p_next, generators))


ACCEPTORS: dict[str, type] = {
    "rejection": RejectionSampler,
    "greedy": GreedyAcceptor,
    "typical": LossyTypicalAcceptor,
}
