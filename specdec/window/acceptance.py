"""Per-position conditional acceptance from decayed counts, and which rows of a step
count (docs/design/auto.md, "Acceptance")."""

from __future__ import annotations

from specdec.types import StepRecord
from specdec.window.config import WindowConfig


def optimistic_rate(kept: float, reached: float, z: float) -> float:
    """The posterior mean rate of `kept` in `reached` draws, z standard errors above it."""
    mean = (kept + 1) / (reached + 2)
    return min(1.0, mean + z * (mean * (1 - mean) / (reached + 3)) ** 0.5)


def step_counts(record: StepRecord) -> tuple[list[int], list[int], int, float]:
    """(rows that tested position i, rows that kept it, rows judged, tokens a judged row
    gained): every row while requests wait; in a batch the caller waits for as a whole,
    the batch itself, as far as its longest rows all went ("Which rows count")."""
    accepted, drafted = record.accepted, record.drafted
    if record.whole_batch:
        longest = max(record.left)
        progress = min(1 + max(accepted), longest - max(record.left_after, default=0))
        asked = max(d for d, r in zip(drafted, record.left, strict=True) if r == longest)
        kept = min(progress - 1, asked)  # the first `kept` drafts every judged row kept
        reached = [int(i <= kept) for i in range(asked)]
        return reached, [int(i < kept) for i in range(asked)], 1, progress
    rows = list(zip(accepted, drafted, strict=True))
    reached = [sum(a >= i and i < d for a, d in rows) for i in range(max(drafted, default=0))]
    kept = [sum(a > i for a in accepted) for i in range(len(reached))]
    return reached, kept, len(accepted), 1 + sum(kept) / max(len(accepted), 1)


class Acceptance:
    """Decayed counts per draft position, shrunk towards the (optimistic) pooled rate."""

    def __init__(self, config: WindowConfig) -> None:
        self.config = config
        self.reached: list[float] = []  # decayed rows that tested position i
        self.kept: list[float] = []  # ... and kept it
        self.asked: list[float] = []  # decayed steps whose window reached draft j + 1
        self.filled: list[float] = []  # ... and whose pass was at least j + 1 drafts wide

    def _decayed(self, totals: list[float], counts: list[int]) -> None:
        """totals[i] = decay x totals[i] + counts[i], `totals` grown to `counts`' length."""
        totals += [0.0] * max(0, len(counts) - len(totals))
        for i, n in enumerate(counts):
            totals[i] = self.config.decay * totals[i] + n

    def add(self, reached: list[int], kept: list[int]) -> None:
        self._decayed(self.reached, reached)
        self._decayed(self.kept, kept)

    def add_width(self, k: int, width: int) -> None:
        """A step's window k and its verify pass's width (1 + its longest draft)."""
        self._decayed(self.asked, [1] * k)
        self._decayed(self.filled, [int(j < width - 1) for j in range(k)])

    @property
    def fill(self) -> list[float]:
        """Per draft j + 1: the chance a step asking for it verifies a pass that wide (a
        drafter sizing its drafts by its match proposes fewer). A pass that wide is at least
        as wide as the one before, so a rarely asked position leans on the one before it (on 1
        the first): a drafter that always fills its window reads 1 everywhere."""
        weight, before, out = self.config.evidence / 2, 1.0, []
        for f, a in zip(self.filled, self.asked, strict=True):
            before = (f + weight * before) / (a + weight)
            out.append(before)
        return out

    @property
    def alpha(self) -> list[float]:
        """Conditional acceptance per position; rarely reached positions borrow the pool."""
        pooled = optimistic_rate(sum(self.kept), sum(self.reached), self.config.optimism)
        weight = self.config.evidence / 2  # a position leans on the pool with half a look
        return [
            (k + weight * pooled) / (r + weight)
            for k, r in zip(self.kept, self.reached, strict=True)
        ]

    def prior(self) -> list[float]:
        """`alpha`, or before anything was drafted the pooled prior it starts from."""
        return self.alpha or [optimistic_rate(0, 0, self.config.optimism)]

    def first_bound(self) -> float:
        """The first position's rate `optimism` standard errors up (a look's bound)."""
        return optimistic_rate(self.kept[0], self.reached[0], self.config.optimism)

    def state(self) -> dict:
        """The counts scaled to at most `evidence` rows at the first position (a warm start)."""
        first = self.reached[0] if self.reached else 0
        scale = min(1.0, self.config.evidence / first) if first else 1.0
        return {name: [n * scale for n in getattr(self, name)] for name in ("reached", "kept")}

    def start_from(self, state: dict) -> None:
        """Begin from a stored `state` instead of the generic prior."""
        reached, kept = list(map(float, state["reached"])), list(map(float, state["kept"]))
        if len(reached) != len(kept):
            raise ValueError("acceptance counts must pair up")
        if any(k < 0 or k > r * (1 + 1e-9) for k, r in zip(kept, reached, strict=True)):
            raise ValueError("acceptance counts must have 0 <= kept <= reached")
        self.reached, self.kept = reached, kept
