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
            logp = torch.log_softmax(logits[b, index].float(), -1)  # [n, V]
        else:
            logp = probs[b, index].float().log()  # [n, V]
        seq.offered.clear()
        seq.offered.extend(entries(logp, tokens[b], seq.params.logprobs))


def entries(logp: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """`logp [n, V]` at the positions of `tokens [n]` -> their entries with `top`
    alternatives each."""
    chosen = logp.gather(1, torch.tensor(list(tokens), device=logp.device)[:, None])[:, 0]
    best, ids = logp.topk(top, -1) if top else (logp[:, :0], logp[:, :0].long())
    chosen, best, ids = chosen.tolist(), best.tolist(), ids.tolist()
    return [
        TokenLogprob(t, c, tuple(zip(i, v, strict=True)))
        for t, c, i, v in zip(tokens, chosen, ids, best, strict=True)
    ]
