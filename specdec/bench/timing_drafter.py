"""A drafter for timing speculative decoding where real weights cannot go (benchmarks only).

A GPU machine that takes no model files can still run the system with weights of the
real shapes (random values), but a random head drafts nothing the random target keeps.
`AcceptanceControlledDrafter` supplies what such a head lacks: a chosen acceptance. It
proposes the target's own greedy continuation, recorded from a plain run of the same
prompt, with the token at draft position i replaced by a wrong one with probability
1 - profile[i], independently per position. Since a chain is kept up to its first wrong
token, position i is kept with probability profile[i] given that every earlier one was:
the conditional acceptance `specdec.window` predicts from (`expected_tokens`). And so
that its time is a real drafter's, it runs a real drafter's passes (`cost`, e.g. an
`EagleDrafter` over an `EagleHead` of the target's shape) and throws their tokens away.

Draft, verify, accept and roll back are then the engine's own, end to end. Greedy output
is the plain output, as with any drafter (the engine keeps only what the target would
have emitted). The record holds only where the run follows it: rows whose committed
tokens leave it (a verify pass rounding differently from the plain passes, in bf16) are
counted in `off_record`, and their later drafts are wrong; report it beside any figure.

Never reachable as a user's `--draft`: the CLI and `LLM` know nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.acceptors import Draft
from specdec.drafters.base import PassStates
from specdec.errors import InvalidParameterError

# Conditional acceptance per draft position (P(i kept | 0..i-1 kept)); a position past
# a profile's end takes its last value.
PROFILES: dict[str, tuple[float, ...]] = {
    # the trained eagle head on the trainer's 8 held-out chats, bf16 target, chain k = 1..5:
    # tokens per pass 1.6261 / 1.9955 / 2.2315 / 2.3876 / 2.495 (the archived
    # docs/BENCHMARKS.md, commit 1f7ab6a: "An eagle head at 2 tokens per pass in
    # the engine", mean over positions). Their differences are the share of
    # positions whose first i drafts were all kept (0.6261, 0.3694, 0.2360, 0.1561,
    # 0.1074); these are their successive ratios.
    "eagle-chat": (0.6261, 0.5900, 0.6389, 0.6614, 0.6880),
    # The same head after learning while serving, in the engine, int4 target, chain k = 3
    # on the bench's 4 chats (heads-k3, acceptance per position 0.471, 0.2353, 0.0977; archived
    # runs, commit 1f7ab6a): what the engine realised on the CPU.
    "eagle-chat-engine": (0.4710, 0.4996, 0.4152),
    "alpha-0.6": (0.6,),
    "alpha-0.8": (0.8,),
}


def check_profile(profile: Sequence[float]) -> tuple[float, ...]:
    profile = tuple(float(a) for a in profile)
    if not profile or not all(0.0 <= a <= 1.0 for a in profile):
        raise InvalidParameterError(
            f"an acceptance profile needs values in [0, 1] per position, got {profile}"
        )
    return profile


def records_from(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> dict:
    """{prompt: its greedy continuation} from a plain run's prompts and output ids."""
    return {tuple(p): list(o) for p, o in zip(prompts, outputs, strict=True)}


class AcceptanceControlledDrafter:
    """Proposes recorded greedy continuations, each position kept with `profile`'s
    conditional probability (see the module docstring).

    `records`: {prompt ids: the target's greedy output ids for it} (`records_from`); a
    row's prompt must be one of them. `vocab_size`: the target's (wrong tokens are drawn
    from it). `cost`: a drafter whose passes run for their time (its proposals are
    discarded; it sees every call of the drafter contract, so its state stays that of a
    drafter in use), or None for a free drafter. `n_predict`: the longest draft (the
    cost drafter's own by default, else 8). `seed`: the corruption's generator.
    """

    def __init__(
        self,
        records: dict[tuple[int, ...], Sequence[int]],
        profile: Sequence[float],
        vocab_size: int,
        cost=None,
        n_predict: int | None = None,
        seed: int = 0,
    ) -> None:
        if vocab_size < 2:
            raise InvalidParameterError("a wrong token needs a vocabulary of 2 ids or more")
        self.records = {tuple(p): list(c) for p, c in records.items()}
        self.profile = check_profile(profile)
        self.vocab_size = vocab_size
        self.cost = cost
        self.n_predict = n_predict or getattr(cost, "n_predict", None) or 8
        self.generator = torch.Generator().manual_seed(seed)
        # Per row, on the host (the step's bookkeeping is a few tensor operations whatever
        # the batch, so the drafter adds little host time of its own to what it times):
        # its record padded past the end (any id: a draft there is never verified), the
        # tokens of it committed, and whether the run still follows it.
        width = max((len(c) for c in self.records.values()), default=0) + self.n_predict + 2
        self.table = torch.zeros(0, width, dtype=torch.long)  # [rows, width]
        self.done = torch.zeros(0, dtype=torch.long)  # [rows]
        self.on_record = torch.zeros(0, dtype=torch.bool)  # [rows]
        self.proposed: torch.Tensor | None = None  # [B, n] the latest proposal
        self.off_record = 0  # rows that left their record

    # the drafter contract ------------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.done)

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        table = torch.zeros(len(histories), self.table.shape[1], dtype=torch.long)
        done = torch.zeros(len(histories), dtype=torch.long)
        on_record = torch.zeros(len(histories), dtype=torch.bool)
        for i, history in enumerate(histories):
            prompt, record = self._record_of(history)
            table[i, : len(record)] = torch.tensor(record, dtype=torch.long)
            done[i] = len(history) - len(prompt)
            on_record[i] = list(history[len(prompt) :]) == record[: int(done[i])]
        self.off_record += int((~on_record).sum())
        self.table = torch.cat([self.table, table])
        self.done = torch.cat([self.done, done])
        self.on_record = torch.cat([self.on_record, on_record])
        if self.cost is not None:
            self.cost.admit(histories)

    def _record_of(self, history: Sequence[int]) -> tuple[tuple[int, ...], list[int]]:
        """The record whose prompt starts `history` (the longest such prompt)."""
        for cut in range(len(history) - 1, 0, -1):
            record = self.records.get(tuple(history[:cut]))
            if record is not None:
                return tuple(history[:cut]), record
        raise InvalidParameterError(
            f"no recorded continuation for a prompt of {len(history) - 1} tokens starting "
            f"{list(history[:8])}: record a plain run of the same prompts first"
        )

    def _ahead(self, n: int) -> torch.Tensor:  # [B, n]
        """Each row's next n recorded tokens."""
        at = self.done[:, None] + torch.arange(n)  # past the padding: a run longer than
        return self.table.gather(1, at.clamp(max=self.table.shape[1] - 1))  # its record

    def propose(self, k, params, generators) -> Draft:
        if self.cost is not None:
            self.cost.propose(k, params, generators)  # for its time only
        B, n = self.rows, min(k, self.n_predict)
        if n == 0:
            self.proposed = None
            return Draft.empty(B)
        truth = self._ahead(n)  # [B, n]
        alpha = torch.tensor([self.profile[min(i, len(self.profile) - 1)] for i in range(n)])
        kept = torch.rand(B, n, generator=self.generator) < alpha  # [B, n]
        shift = torch.randint(1, self.vocab_size, (B, n), generator=self.generator)
        wrong = (truth + shift) % self.vocab_size  # never the true token
        self.proposed = torch.where(kept, truth, wrong)
        return Draft(self.proposed.clone(), None, torch.full((B,), n, dtype=torch.long))

    def commit(self, num_accepted, next_tokens) -> None:
        """Advance each row along its record; a row whose committed tokens differ from it
        is off the record from then on (counted once)."""
        accepted = num_accepted.cpu()  # [B]
        n = 0 if self.proposed is None else self.proposed.shape[1]
        got = torch.zeros(self.rows, n + 1, dtype=torch.long)  # [B, n+1]: kept, then next
        if n:
            got[:, :n] = self.proposed
        got.scatter_(1, accepted[:, None], next_tokens.cpu()[:, None])
        beyond = torch.arange(n + 1)[None, :] > accepted[:, None]  # not committed
        follows = ((got == self._ahead(n + 1)) | beyond).all(1)  # [B]
        self.off_record += int((self.on_record & ~follows).sum())
        self.on_record &= follows
        self.done += accepted + 1
        if self.cost is not None:
            self.cost.commit(num_accepted, next_tokens)

    def observe_pass(self, states: PassStates) -> None:
        if self.cost is not None:
            self.cost.observe_pass(states)

    def move_row(self, src: int, dst: int) -> None:
        for rows in (self.table, self.done, self.on_record):
            rows[dst] = rows[src]
        if self.cost is not None:
            self.cost.move_row(src, dst)  # (it resets src itself)
        self._drop(src)

    def reset_row(self, row: int) -> None:
        if self.cost is not None:
            self.cost.reset_row(row)
        self._drop(row)

    def _drop(self, row: int) -> None:
        """Rows leave from the end (the engine moves the last row into a freed one)."""
        if row == self.rows - 1:
            self.table, self.done = self.table[:row], self.done[:row]
            self.on_record = self.on_record[:row]

    # what `auto` prices: the cost drafter's ------------------------------------------

    def catch_up_tokens(self) -> int:
        return 0 if self.cost is None else self.cost.catch_up_tokens()

    @property
    def last_catch_up(self) -> tuple[int, float]:
        return (0, 0.0) if self.cost is None else self.cost.last_catch_up

    @property
    def last_first_s(self) -> float | None:
        return None if self.cost is None else self.cost.last_first_s

    @property
    def model(self):
        return None if self.cost is None else self.cost.model


def realised_acceptance(traces: Sequence[Sequence[tuple[int, int, int]]]) -> tuple[list, list]:
    """(reached, kept) per draft position over the engine's step traces of some
    sequences (`LiveSequence.trace`: (drafted, accepted, emitted) per step): position i
    is reached where all before it were kept, and kept where the accepted prefix passes
    it. kept[i] / reached[i] estimates the conditional acceptance at i."""
    reached: list[int] = []
    kept: list[int] = []
    for trace in traces:
        for drafted, accepted, _ in trace:
            for i in range(min(drafted, accepted + 1)):
                if i == len(reached):
                    reached.append(0)
                    kept.append(0)
                reached[i] += 1
                kept[i] += i < accepted
    return reached, kept


def profile_chi_square(
    reached: Sequence[int], kept: Sequence[int], profile: Sequence[float]
) -> tuple[float, int]:
    """(statistic, degrees of freedom): Pearson's chi-square of the kept counts per
    position against `profile` (binomial per position, positions reached at least 5
    times whose probability is strictly between 0 and 1; a count a probability of 0 or 1
    forbids makes the statistic infinite)."""
    statistic, dof = 0.0, 0
    for i, (n, x) in enumerate(zip(reached, kept, strict=True)):
        p = profile[min(i, len(profile) - 1)]
        if p in (0.0, 1.0):
            if x != n * p:
                return float("inf"), dof + 1
            continue
        if n < 5:
            continue
        statistic += (x - n * p) ** 2 / (n * p * (1 - p))
        dof += 1
    return statistic, dof
