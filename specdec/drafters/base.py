"""The drafter contract.

A drafter follows the engine's live rows (row i of the drafter is row i of the target's
cache) and keeps its own state; it never touches the target's. For each row the engine
has a history of committed tokens whose last token is not yet in any KV cache.

- `admit(histories)`: new rows appended after the current ones, each with its history.
- `propose(k, params, generators) -> Draft`: up to k tokens per row continuing the history.
  The engine may shorten a row's draft afterwards (`Draft.lengths`, e.g. near max_tokens);
  `commit` then reports at most that many accepted. A drafter may instead return a
  `TreeDraft` (`specdec.heads.tree`) of up to k levels: candidate continuations the
  engine verifies in one pass; the accepted tokens then form one of its paths, so a tree
  drafter must not need to know which (speculator heads only need `next_tokens`).
- `commit(num_accepted [B], next_tokens [B])`: the target kept the first num_accepted
  draft tokens (of a tree: along the accepted path) and added next_tokens; roll back
  whatever else was drafted.
- `move_row(src, dst)` / `reset_row(row)`: the engine repacks rows when sequences finish.

Optional powers are separate protocols, which the engine checks once when it builds the
drafter (`DrafterPowers`), so its step calls them without probing:

- `WatchesTarget.observe_pass(states: PassStates)`: what a target pass kept, after the
  prefill of admitted rows (rows first_row..) and after every verify pass (all rows,
  following `commit`): the kept tokens and the target's final-normed state at each.
  `states.last` is the state each row's last committed token was sampled from
  (speculator heads draft from it); a learning drafter records them all.
- `Learns.between_steps(idle=False) -> bool`: the engine's time between its steps, after
  every decode step and, with `idle`, while it has nothing to serve; a learning drafter
  trains its heads here (`specdec.training.online`). Returns whether it used the time.
- `UsesProcessors.use_processors(processors)`: before each `propose`, the rows' logits
  processors (`specdec.processors.RequestProcessor` or None per row: penalties, logit_bias,
  grammar masks). A drafter with a distribution applies them to it, position j after its
  own drafts before j, and samples from the result, so its drafts are what the processed
  target would say; the acceptors are lossless whatever q is, so a drafter without this
  power only loses acceptance.
- `UsesPrefixCache.use_prefix_cache(store: PrefixCache)`: a drafter with its own KV cache
  reuses stored keys and values of sequences it has seen (`specdec.models.prefix_cache`).
- `CatchesUp`: `catch_up_tokens()`, the tokens a step with k > 0 must feed before it
  drafts (a lazy draft model's rows not caught up: `auto` starts only when the rows'
  remaining tokens repay them), and `last_catch_up`, the (tokens, seconds) of the latest
  step's catch-up pass, a one-off kept out of the step's draft time.
- `ReadsLayerInputs`: `aux_layers`, the target layers whose inputs (`PassStates.aux`)
  every target pass hands the drafter (an EAGLE-3 head's auxiliary states); each pass asks
  the target for them, so the target keeps no state for its drafter.
- `ReportsCosts`: `model`, the draft network whose bytes and kernel plans price a step
  before it is timed, and `last_first_s`, the seconds of the latest step's first draft
  token when they differ from the later ones' (None otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specdec.acceptors import Draft
from specdec.models.prefix_cache import PrefixCache
from specdec.params import SamplingParams


class Drafter(Protocol):
    """The core contract: follow the rows, propose, and keep what the target kept."""

    def admit(self, histories: Sequence[Sequence[int]]) -> None: ...

    def propose(
        self,
        k: int,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
    ) -> Draft: ...

    def commit(self, num_accepted: torch.Tensor, next_tokens: torch.Tensor) -> None: ...

    def move_row(self, src: int, dst: int) -> None: ...

    def reset_row(self, row: int) -> None: ...


@runtime_checkable
class WatchesTarget(Protocol):
    def observe_pass(self, states: PassStates) -> None: ...


@runtime_checkable
class Learns(Protocol):
    def between_steps(self, idle: bool = False) -> bool: ...


@runtime_checkable
class UsesPrefixCache(Protocol):
    def use_prefix_cache(self, store: PrefixCache) -> None: ...


@runtime_checkable
class UsesProcessors(Protocol):
    def use_processors(self, processors: Sequence) -> None: ...


@runtime_checkable
class CatchesUp(Protocol):
    last_catch_up: tuple[int, float]

    def catch_up_tokens(self) -> int: ...


@runtime_checkable
class ReadsLayerInputs(Protocol):
    aux_layers: tuple[int, ...]


@runtime_checkable
class ReportsCosts(Protocol):
    model: torch.nn.Module | None
    last_first_s: float | None


@dataclass(frozen=True)
class DrafterPowers:
    """A drafter's optional powers, looked up once (None: the drafter has not got it)."""

    watches: WatchesTarget | None
    learns: Learns | None
    catches_up: CatchesUp | None
    costs: ReportsCosts | None
    processors: UsesProcessors | None
    layer_inputs: ReadsLayerInputs | None

    @classmethod
    def of(cls, drafter: Drafter | None) -> DrafterPowers:
        def power(kind):
            return drafter if isinstance(drafter, kind) else None

        kinds = (WatchesTarget, Learns, CatchesUp, ReportsCosts, UsesProcessors, ReadsLayerInputs)
        return cls(*(power(kind) for kind in kinds))

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The layers whose inputs every target pass must hand over (none: `()`)."""
        return () if self.layer_inputs is None else tuple(self.layer_inputs.aux_layers)


@dataclass(frozen=True)
class PassStates:
    """The positions one target pass kept, for rows `first_row .. first_row + B`.

    A prefill keeps every prompt position; a verify pass keeps the last committed token and
    the accepted drafts (of a tree: along the accepted path). The state at a position is the
    one that predicts the token after it."""

    tokens: torch.Tensor  # [B, T] token ids at the kept positions (right-padded)
    hidden: torch.Tensor  # [B, T, H] the target's final-normed state at each
    lengths: torch.Tensor  # [B] kept positions per row (>= 1), on hidden's device
    first_row: int = 0
    # [B, T, k*H] the inputs of the drafter's `aux_layers` at each (EAGLE-3 heads read
    # them), or None where the target was asked for none
    aux: torch.Tensor | None = None

    @property
    def last(self) -> torch.Tensor:
        """`[B, H]`: the state at each row's last kept position."""
        rows = torch.arange(len(self.lengths), device=self.hidden.device)
        return self.hidden[rows, self.lengths - 1]

    def select(self, rows: list[int], first_row: int) -> PassStates:
        """Only `rows` (indices into this batch), renumbered from `first_row`."""
        index = torch.tensor(rows, dtype=torch.long, device=self.hidden.device)
        aux = None if self.aux is None else self.aux[index]
        return PassStates(
            self.tokens[index], self.hidden[index], self.lengths[index], first_row, aux
        )
