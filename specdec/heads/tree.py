"""Candidate trees: many drafted continuations verified in one target pass.

The speculator heads give top-k candidates per head; every combination is a candidate path
(4 x 3 x 2 = 24 for `topk=(4, 3, 2)`) scored by its summed log-probability. The best
`n_candidates` are kept and their shared prefixes merged into a tree whose root is the last
committed token (not a node). The tree is flattened for the target:

- `tokens [N]`: node tokens, parents before children, the best path's nodes first;
- `parents [N]`: the parent node's index, -1 for children of the root;
- `depth [N]`: 0 for children of the root (they sit at position committed length + 1);
- `mask [N, N]`: node i sees node j iff j is i or one of its ancestors;
- `paths`: root-to-leaf paths as node indices, best scoring first.

A batch pads every row's tree to the widest (`TreeDraft`): pad nodes see only themselves,
have no parent in the tree (-1) and lie on no path, so they are never accepted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specdec.errors import InvalidParameterError
from specdec.types import TokenTree, TreeDraft


def check_tree(
    tree: Sequence[int], n_predict: int, n_candidates: int | None
) -> tuple[tuple[int, ...], int]:
    """A drafter's `tree` (top-k per draft position, at most `n_predict` levels) and its
    `n_candidates` (default: every combination), checked."""
    tree = tuple(int(t) for t in tree)
    if not tree or min(tree) < 1 or len(tree) > n_predict:
        raise InvalidParameterError(
            f"tree needs 1..{n_predict} top-k sizes >= 1 (one per head), got {tree}"
        )
    n_candidates = n_candidates or math.prod(tree)
    if n_candidates < 1:
        raise InvalidParameterError(f"n_candidates must be >= 1, got {n_candidates}")
    return tree, n_candidates


def max_tree_nodes(tree: Sequence[int], n_candidates: int) -> int:
    """The most nodes a tree of the best `n_candidates` paths of `tree` can have: level i
    holds at most prod(tree[:i+1]) nodes and at most one per kept path."""
    return sum(min(n_candidates, math.prod(tree[: i + 1])) for i in range(len(tree)))


def tree_draft(
    paths: torch.Tensor,  # [B, P, n] candidate token paths (host)
    scores: torch.Tensor,  # [B, P] summed log-probabilities (host)
    params: Sequence,  # [B] SamplingParams
    n_candidates: int,
    sampled_tree: bool,
    device: torch.device | str,
) -> TreeDraft:
    """Each row's best `n_candidates` paths merged into its tree; a row that samples gets
    only its best path unless `sampled_tree`."""
    trees = []
    for b in range(len(paths)):
        keep = n_candidates if params[b].greedy or sampled_tree else 1
        trees.append(TokenTree.from_paths(select_paths(paths[b], scores[b], keep)))
    return TreeDraft.from_trees(trees, device)


def select_paths(
    paths: torch.Tensor,  # [P, n] candidate token paths
    scores: torch.Tensor,  # [P] summed log-probabilities
    n_candidates: int,
) -> list[tuple[int, ...]]:
    """The `n_candidates` best-scoring paths as token tuples, best first (ties keep the
    enumeration order, so the result is deterministic)."""
    order = sorted(range(len(scores)), key=lambda p: -float(scores[p]))
    rows = paths.tolist()
    return [tuple(rows[p]) for p in order[:n_candidates]]


def greedy_walk(tree: TokenTree, best: Sequence[int]) -> list[int]:
    """The path that follows the tokens chosen at each node as long as the tree has them:
    `best[0]` is the token chosen at the root (the target's argmax there, or a sample),
    `best[1 + i]` at node i. Returns node indices."""
    path, node = [], -1
    while True:
        want = best[node + 1]
        nxt = next(
            (i for i, p in enumerate(tree.parents) if p == node and tree.tokens[i] == want), None
        )
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


class TreeWalkSampler:
    """Lossless verification of a deterministic candidate tree, at any temperature.

    One token is chosen at the root and at every node from the target's distribution
    there: the argmax for greedy rows (or all rows with `argmax=True`), else a sample from
    the row's generator. The walk descends while the chosen token is a child, and emits the
    path plus the token chosen at its last node. Only the choices along the walk matter,
    and each is a draw from p given exactly the tokens before it: ancestral sampling of
    the target, so the output is distributed as plain sampling. This is SpecInfer's
    recursive rejection sampling for one-hot draft candidates: child c_i is accepted with
    probability p'(c_i) under the residual p' left by the rejected siblings, which
    sampling x ~ p and checking x against the children realises exactly.
    """

    lossless = True

    def __init__(self, argmax: bool = False) -> None:
        self.argmax = argmax

    def __call__(
        self,
        trees: Sequence[TokenTree],
        probs: torch.Tensor,  # [B, 1+N, V]: at the root, then at each node
        greedy: Sequence[bool],
        generators: Sequence[torch.Generator],
    ) -> tuple[list[list[int]], list[int]]:
        """Per row the accepted path (node indices) and the token emitted after it."""
        chosen = [
            probs[b].argmax(-1)
            if self.argmax or greedy[b]
            else torch.multinomial(probs[b], 1, generator=generators[b])[:, 0]
            for b in range(len(trees))
        ]
        chosen = torch.stack(chosen).tolist()  # [B, 1+N], the host sync of the walk
        paths = [greedy_walk(tree, row) for tree, row in zip(trees, chosen, strict=True)]
        nexts = [row[1 + path[-1] if path else 0] for row, path in zip(chosen, paths, strict=True)]
        return paths, nexts
