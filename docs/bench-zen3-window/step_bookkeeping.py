"""The per-step counts a window plans with: before (torch operations in the engine's
`_judged_rows` / `_conditional_counts`) and after (a StepRecord built from the step's lists
and `window.acceptance.step_counts`). Run from the worktree root with PYTHONPATH=$PWD."""

import timeit

import torch

from specdec.step_record import StepRecord
from specdec.window.acceptance import step_counts


def before(accepted, cap, k, rows):
    judged = torch.ones(rows, dtype=torch.bool)
    asked = torch.clamp(cap, max=k)
    acc, limit = accepted[judged], asked[judged]
    positions = torch.arange(int(asked.max()))[None, :]
    reached = (acc[:, None] >= positions) & (positions < limit[:, None])
    kept = acc[:, None] > positions
    return reached.sum(0).tolist(), kept.sum(0).tolist(), int(judged.sum())


def after(accepted, cap, k, rows, left):
    record = StepRecord(
        rows, k, k + 1, drafted=tuple(torch.clamp(cap, max=k).tolist()),
        accepted=tuple(accepted.tolist()), left=tuple(left), left_after=tuple(left),
        draft_s=0.01, verify_s=0.02,
    )  # fmt: skip
    return step_counts(record)


def main() -> None:
    torch.set_num_threads(1)
    k = 4
    for rows in (1, 4, 16):
        accepted = torch.randint(0, k + 1, (rows,))
        cap, left = torch.full((rows,), 60), [61] * rows
        args = (accepted, cap, k, rows)
        old = min(timeit.repeat(lambda a=args: before(*a), number=2000, repeat=5)) / 2000
        new = min(timeit.repeat(lambda a=args, b=left: after(*a, b), number=2000, repeat=5)) / 2000
        print(f"rows={rows} k={k}: before {old * 1e6:.1f} us, after {new * 1e6:.1f} us")


if __name__ == "__main__":
    main()
