"""Suffix decoding combined with a drafter that has a distribution (`--draft suffix+KIND:...`):
each row's draft comes from whichever is expected to have more of it accepted.

At every step each row's suffix lookup gives a draft and its expected accepted length (the
match's frequency-adapted probabilities summed, `suffix.weighed_continuation`); the other
drafter's is `a + a^2 + ... + a^k` with `a` the rate at which the target kept its drafted
tokens so far (kept / tested, as `suffix.Calibration` counts). A row takes the suffix
draft where its expected length is the larger. When every row does, the other drafter
skips the step (k = 0, as a step that does not speculate), so a repeated span costs
nothing to draft; a draft model then catches up on the tokens it did not draft
(`DraftModelDrafter.commit_foreign`, fed lazily at its next draft as after k = 0 steps).

Lossless: each row's q is the q of the drafter that drafted its tokens (one-hot for the
suffix's), and which drafter a row takes depends only on what came before the step.

The hybrid has the powers of its other drafter (`drafters.base`): a class is made per
combination of powers, so the engine's one-time `DrafterPowers.of` sees exactly them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import (
    CatchesUp,
    Drafter,
    Learns,
    ReportsCosts,
    UsesPrefixCache,
    UsesProcessors,
    WatchesTarget,
)
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import InvalidParameterError
from specdec.types import Draft


class HybridDrafter:
    """The core contract over a `SuffixDrafter` and another drafter (`other`)."""

    HORIZON = 256.0  # tested tokens past which the other drafter's counts are halved
    EXPLORE = 8.0  # tested tokens of a kind of suffix match before its rate decides

    def __init__(self, suffix: SuffixDrafter, other: Drafter) -> None:
        if getattr(other, "tree", None) is not None or getattr(other, "max_nodes", 0):
            raise InvalidParameterError("a suffix hybrid drafts chains: no --tree with it")
        if getattr(other, "learner", None) is not None:
            raise InvalidParameterError("a suffix hybrid cannot --learn (the heads would "
                                        "record the suffix's verdicts as theirs)")  # fmt: skip
        self.suffix, self.other = suffix, other
        self.kept, self.tested = 1.0, 2.0  # the other drafter's verdicts (a 0.5 prior)
        self._foreign: dict[int, list[int]] = {}  # rows the suffix drafted this step
        self._other_k = 0  # the window the other drafter drafted this step
        self.suffix_rows = self.other_rows = 0  # row-steps each drafted (for reports)

    def expected_other(self, k: int) -> float:
        """The other drafter's expected accepted length at window k (i.i.d. at rate a)."""
        a = self.kept / self.tested
        return sum(a**j for j in range(1, k + 1))

    def takes_suffix(self, row: int, kind, expected: float, bar: float) -> bool:
        """Whether `row` verifies the suffix's draft (`expected` accepted) this step rather
        than the other drafter's (`bar`). A kind of match the target has judged too few
        drafts of to rate is tried, so that its rate is learnt (else a suffix draft rated
        at the prior might never be taken). Must depend only on what came before."""
        untried = self.suffix.store.calibration.tested.get(kind, 0.0) < self.EXPLORE
        return expected > bar or untried

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        self.suffix.admit(histories)
        self.other.admit(histories)

    def propose(self, k, params, generators) -> Draft:
        rows = len(params)
        looked = [self.suffix.weighed_lookup(row, k) for row in range(rows)]
        bar = self.expected_other(k)
        self._foreign = {
            row: draft
            for row, (draft, kind, expected) in enumerate(looked)
            if draft and self.takes_suffix(row, kind, expected, bar)
        }
        self._other_k = 0 if len(self._foreign) == rows else k
        other = self.other.propose(self._other_k, params, generators)
        self.suffix_rows += len(self._foreign)
        self.other_rows += rows - len(self._foreign) if self._other_k else 0
        draft = self._joined(other, rows)
        self.suffix.drafted(
            [draft.tokens[row, : int(draft.lengths[row])].tolist() for row in range(rows)],
            [looked[row][1] if row in self._foreign else None for row in range(rows)],
        )
        return draft

    def _joined(self, other: Draft, rows: int) -> Draft:
        """The other drafter's draft with the suffix rows' drafts in their place (q
        one-hot there); wide enough for both."""
        if not self._foreign:
            return other
        width = max(other.k, *(len(d) for d in self._foreign.values()))
        tokens = torch.zeros(rows, width, dtype=torch.long, device=other.tokens.device)
        tokens[:, : other.k] = other.tokens
        lengths = other.lengths.clone()
        probs = None
        if other.probs is not None:  # [B, k, V] -> [B, width, V], one-hot rows of the suffix
            probs = other.probs.new_zeros(rows, width, other.probs.shape[2])
            probs[:, : other.k] = other.probs
        for row, found in self._foreign.items():
            tokens[row] = 0
            tokens[row, : len(found)] = torch.tensor(found, dtype=torch.long)
            lengths[row] = len(found)
            if probs is not None:
                probs[row] = 0
                probs[row, torch.arange(width), tokens[row]] = 1.0
        return Draft(tokens, probs, lengths)

    def commit(self, num_accepted, next_tokens) -> None:
        self.suffix.commit(num_accepted, next_tokens)
        accepted = num_accepted.tolist()
        if self._other_k:  # the other drafter's verdicts, where it drafted
            for row, n in enumerate(accepted):
                if row not in self._foreign:
                    self.kept += n
                    self.tested += min(n + 1, self._other_k)
            if self.tested > self.HORIZON:
                self.kept, self.tested = self.kept / 2, self.tested / 2
        if not self._foreign:
            self.other.commit(num_accepted, next_tokens)
        elif hasattr(self.other, "commit_foreign"):
            self.other.commit_foreign(num_accepted, next_tokens, self._foreign)
        else:  # heads read the kept tokens' states from the pass (`observe_pass`)
            self.other.commit(num_accepted, next_tokens)
        self._foreign = {}

    def move_row(self, src: int, dst: int) -> None:
        self.suffix.move_row(src, dst)
        self.other.move_row(src, dst)

    def reset_row(self, row: int) -> None:
        self.suffix.reset_row(row)
        self.other.reset_row(row)


# ---- the other drafter's powers, forwarded ---------------------------------------------------


class _Watches:
    def observe_pass(self, states) -> None:
        self.other.observe_pass(states)


class _Learns:
    def between_steps(self, idle: bool = False) -> bool:
        return self.other.between_steps(idle)


class _PrefixCache:
    def use_prefix_cache(self, store) -> None:
        self.other.use_prefix_cache(store)


class _Processors:
    def use_processors(self, processors) -> None:
        self.other.use_processors(processors)


class _CatchesUp:
    @property
    def last_catch_up(self) -> tuple[int, float]:
        return self.other.last_catch_up

    def catch_up_tokens(self) -> int:
        return self.other.catch_up_tokens()


class _Costs:
    @property
    def model(self):
        return self.other.model

    @property
    def last_first_s(self) -> float | None:
        return self.other.last_first_s


POWERS = (
    (WatchesTarget, _Watches),
    (Learns, _Learns),
    (UsesPrefixCache, _PrefixCache),
    (UsesProcessors, _Processors),
    (CatchesUp, _CatchesUp),
    (ReportsCosts, _Costs),
)
_classes: dict[tuple[type, ...], type] = {}


def hybrid(suffix: SuffixDrafter, other: Drafter) -> HybridDrafter:
    """A HybridDrafter with exactly the optional powers `other` has."""
    mixins = tuple(mixin for power, mixin in POWERS if isinstance(other, power))
    cls = _classes.get(mixins)
    if cls is None:
        cls = _classes[mixins] = type("HybridDrafter", (*mixins, HybridDrafter), {})
    return cls(suffix, other)


def hybrid_factory(suffix_factory, other_factory):
    """An engine's `drafter_factory` over the two parts' factories."""
    return lambda max_batch, max_len: hybrid(
        suffix_factory(max_batch, max_len), other_factory(max_batch, max_len)
    )
