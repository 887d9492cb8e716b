"""Log probabilities of the emitted tokens, from the distribution each was judged against.

A request asking for them (`SamplingParams.logprobs`, the number of alternatives) gets, for
every token it emits, the token's log probability and the most likely alternatives under
the target's distribution at that position: the processed logits (`specdec.processors`)
after the request's temperature, top-k and top-p, the `p` the acceptor judged against, so
speculative and plain decoding report the same values. A greedy request's `p` is one-hot;
it gets the processed logits' log-softmax (temperature 1), the distribution its argmax was
taken from, as OpenAI reports at temperature 0. Tokens outside top-k/top-p have -inf.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log probability), most likely first


def offer_logprobs(
    seqs: Sequence,
    logits: torch.Tensor,
    probs: torch.Tensor | None,
    positions: Sequence[Sequence[int]],
    tokens: Sequence[Sequence[int]],
) -> None:
    """For each sequence that asks, queue the entries of the tokens a pass emits (row b:
    `tokens[b]` from positions `positions[b]` of `logits [B, T, V]` (processed) or `probs
    [B, T, V]`, None where every row is greedy); `LiveSequence.append` takes them in order."""
    for b, seq in enumerate(seqs):
        if seq.logprobs is None:
            continue
        index = torch.tensor(list(positions[b]), device=logits.device)
        if seq.params.greedy or probs is None:
            scores = logits[b, index].float()  # [n, V]
            norm = torch.logsumexp(scores, -1, keepdim=True)  # [n, 1]

            def to_logp(values: torch.Tensor, norm=norm) -> torch.Tensor:
                return values - norm  # log-softmax without writing it out over V
        else:
            scores, to_logp = probs[b, index].float(), torch.log  # log keeps the ranking
        seq.offered.clear()
        seq.offered.extend(entries(scores, to_logp, tokens[b], seq.params.logprobs))


def entries(scores: torch.Tensor, to_logp, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """`scores [n, V]` at the positions of `tokens [n]` (ranked as their log probabilities,
    `to_logp` of them, are) -> their entries with `top` alternatives each; only the chosen
    and the top ones are turned into log probabilities (4x cheaper than a log-softmax over
    a 151,936-token vocabulary)."""
    ids_in = torch.tensor(list(tokens), device=scores.device)[:, None]  # [n, 1]
    chosen = to_logp(scores.gather(1, ids_in))[:, 0]  # [n]
    best, ids = scores.topk(top, -1) if top else (scores[:, :0], scores[:, :0].long())
    chosen, best, ids = chosen.tolist(), to_logp(best).tolist(), ids.tolist()
    return [
        TokenLogprob(t, c, tuple(zip(i, v, strict=True)))
        for t, c, i, v in zip(tokens, chosen, ids, best, strict=True)
    ]
