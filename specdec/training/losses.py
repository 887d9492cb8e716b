"""The heads' objectives: teacher-forced losses and accuracy of MLP heads, an eagle head and
an EAGLE-3 head (its draft steps unrolled: the training-time test)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.heads.eagle import EagleHead
from specdec.heads.eagle3 import Eagle3Head
from specdec.heads.mlp import MLPSpeculator

EAGLE_NOISE = 0.1  # uniform noise on an eagle head's input states, x their RMS (EAGLE-1)


@dataclass
class HeadMetrics:
    loss: float  # summed over heads
    loss_per_head: list[float]
    acc_per_head: list[float]  # top-1 accuracy, teacher-forced
    tokens: int


class _Tally:
    """Each head's (or draft step's) cross-entropy and top-1 accuracy as the losses go, and
    the most tokens any of them scored."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.accs: list[float] = []
        self.tokens = 0

    def score(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The cross-entropy of `scores` [M, N] for `target` [M] (a zero that keeps the
        graph where M = 0), recorded with its accuracy."""
        loss = F.cross_entropy(scores, target) if len(scores) else scores.sum()
        self.losses.append(float(loss.detach()))
        self.accs.append(float((scores.argmax(-1) == target).float().mean()) if len(scores) else 0)
        self.tokens = max(self.tokens, len(scores))
        return loss

    def metrics(self, total: torch.Tensor) -> HeadMetrics:
        return HeadMetrics(float(total.detach()), self.losses, self.accs, self.tokens)


def head_losses(
    spec: MLPSpeculator,
    hidden: torch.Tensor,  # [B, T, E] the target's states
    tokens: torch.Tensor,  # [B, T] target ids
    valid: torch.Tensor,  # [B, T] bool: tokens the heads may be asked to predict
    labels: torch.Tensor | None = None,  # [B, T] what to predict at each position (tokens)
) -> tuple[torch.Tensor, HeadMetrics]:
    """Sum over heads of the mean cross-entropy of head i for token t+i+2 at every t, given
    the state at t and tokens t+1..t+i+1; `labels` replaces the token to predict (the
    target's own choice, `target_labels`), never the tokens the heads are fed."""
    n, N = spec.config.n_predict, spec.config.vocab_size
    L = tokens.shape[1] - n - 1
    labels = tokens if labels is None else labels
    inputs = torch.stack([tokens[:, i + 1 : i + 1 + L] for i in range(n)], -1)  # [B, L, n]
    logits = spec(hidden[:, :L].float(), inputs)  # n x [B, L, N]
    total, tally = 0.0, _Tally()
    for i in range(n):
        target = spec.to_draft[labels[:, i + 2 : i + 2 + L]]  # [B, L] draft ids (N: outside)
        ok = valid[:, i + 2 : i + 2 + L] & (target < N)
        scores = logits[i][ok]  # [M, N]
        total = total + tally.score(scores, target[ok])
    return total, tally.metrics(total)


def eagle_losses(
    head: EagleHead,
    hidden: torch.Tensor,  # [B, T, E] the target's states
    tokens: torch.Tensor,  # [B, T] target ids
    valid: torch.Tensor,  # [B, T] bool: positions that hold real tokens
    labels: torch.Tensor | None = None,  # [B, T] what to predict at each position (tokens)
    steps: int = 3,
    cls_weight: float = 0.1,
    generator: torch.Generator | None = None,  # the noise's (a resumed run draws the same)
) -> tuple[torch.Tensor, HeadMetrics]:
    """Sum over draft steps 1..steps (`EagleHead.unrolled`) of the state regression
    (smooth L1 against the target's state, EAGLE's) plus `cls_weight` x the cross-entropy
    of the token it implies. Step s at position p predicts state p+1 and token p+2 from
    a chain whose newest true state is at p-s+1. The input states get uniform noise of
    `EAGLE_NOISE` x their RMS, so that the head learns to read imperfect states, as its
    own predictions are when it drafts."""
    N = head.config.vocab_size
    labels = tokens if labels is None else labels
    B, T, _ = hidden.shape
    feats = hidden[:, :-1].float()
    rms = float(feats.pow(2).mean().sqrt())
    noise = torch.rand(feats.shape, generator=generator, device=feats.device)
    feats = feats + (noise * 2 - 1) * (EAGLE_NOISE * rms)
    positions = torch.arange(T - 1, device=hidden.device)[None].expand(B, -1)
    preds = head.unrolled(tokens[:, 1:], feats, positions, steps)  # steps x [B, T-1, E]
    total, tally = 0.0, _Tally()
    for i, pred in enumerate(preds):  # step i+1: positions p >= i
        ok_state = valid[:, i + 1 :]  # [B, T-1-i] the state p+1 is real
        reg = F.smooth_l1_loss(pred[:, i:].float()[ok_state], hidden[:, i + 1 :].float()[ok_state])
        target = head.to_draft[labels[:, i + 2 :]]  # [B, T-2-i] token p+2 as a draft id
        ok = valid[:, i + 2 :] & (target < N)
        scores = head.logits(pred[:, i:-1])[ok].float()  # [M, N]
        total = total + reg + cls_weight * tally.score(scores, target[ok])
    return total, tally.metrics(total)


def eagle3_losses(
    head: Eagle3Head,
    aux: torch.Tensor,  # [B, T, 3H] the target's auxiliary states
    tokens: torch.Tensor,  # [B, T] target ids
    valid: torch.Tensor,  # [B, T] bool: positions that hold real tokens
    labels: torch.Tensor | None = None,  # [B, T] what to predict at each position (tokens)
    steps: int = 3,
) -> tuple[torch.Tensor, HeadMetrics]:
    """Sum over draft steps 1..steps of the cross-entropy of the token each predicts
    (EAGLE-3 drops EAGLE's state regression: the head predicts tokens, and its state is its
    own). Step s at position p predicts token p+2 from a chain whose newest true state is
    at p-s+1, the later steps entering the head's own earlier states (`Eagle3Head.unrolled`:
    the training-time test)."""
    N = head.config.draft_vocab_size
    labels = tokens if labels is None else labels
    B, T, _ = aux.shape
    positions = torch.arange(T - 1, device=aux.device)[None].expand(B, -1)
    preds = head.unrolled(tokens[:, 1:], aux[:, :-1].float(), positions, steps)  # [B, T-1, H]
    total, tally = 0.0, _Tally()
    for i, pred in enumerate(preds):  # step i+1: positions p >= i
        target = head.to_draft[labels[:, i + 2 :]]  # [B, T-2-i] token p+2 as a draft id
        ok = valid[:, i + 2 :] & (target < N)
        scores = head.logits(pred[:, i:-1])[ok].float()  # [M, N]
        total = total + tally.score(scores, target[ok])
    return total, tally.metrics(total)
