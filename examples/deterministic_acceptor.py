r"""A custom token acceptor: more deterministic output than sampling. LOSSY.

It keeps a draft token whenever the target ranks it among its `top_n` most likely tokens,
and otherwise emits the target's argmax. Outputs stay close to greedy decoding while
accepting more of the draft than exact greedy matching does. It changes the output
distribution, so it is named and flagged as lossy.

Use it from the CLI or the Python API:

    specdec generate --model M --draft D \
        --acceptor examples/deterministic_acceptor.py:LossyTopNAcceptor ...
    LLM(M, draft=D, acceptor=LossyTopNAcceptor(top_n=2))
"""

import torch

from specdec.acceptors import Verdict


class LossyTopNAcceptor:
    lossless = False  # it does not preserve the target distribution

    def __init__(self, top_n: int = 2) -> None:
        self.top_n = top_n

    def __call__(self, draft, target_probs, generators) -> Verdict:
        k = draft.tokens.shape[1]
        top = target_probs[:, :k].topk(self.top_n, dim=-1).indices  # [B, k, top_n]
        in_top = (top == draft.tokens[..., None]).any(-1)  # [B, k]
        device = target_probs.device
        in_draft = torch.arange(k, device=device)[None, :] < draft.lengths.to(device)[:, None]
        num_accepted = (in_top & in_draft).long().cumprod(1).sum(1)  # [B]
        # Accepted prefix, then the target's argmax at the first rejected position, then -1.
        best = target_probs.argmax(-1)  # [B, k+1]
        tokens = torch.cat([draft.tokens, best[:, k:]], 1)
        positions = torch.arange(k + 1, device=device)[None, :]
        tokens = torch.where(positions < num_accepted[:, None], tokens, -1)
        tokens.scatter_(1, num_accepted[:, None], best.gather(1, num_accepted[:, None]))
        return Verdict(tokens=tokens, num_accepted=num_accepted)
