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
from dataclasses import dataclass

import torch

from specdec.errors import InvalidParameterError


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


@dataclass(frozen=True)
class TokenTree:
    """One row's flattened tree (see the module docstring)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depth: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]  # root-to-leaf node indices, best first

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TokenTree:
        """Merge token paths (best first) on their shared prefixes. A path that is a prefix
        of another adds no leaf."""
        tokens: list[int] = []
        parents: list[int] = []
        depth: list[int] = []
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        node_paths: list[tuple[int, ...]] = []
        for path in paths:
            node, nodes = -1, []
            for d, token in enumerate(path):
                key = (node, int(token))
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(int(token))
                    parents.append(node)
                    depth.append(d)
                node = children[key]
                nodes.append(node)
            if nodes:
                node_paths.append(tuple(nodes))
        has_child = {p for p in parents if p >= 0}
        leaves, seen = [], set()
        for nodes in node_paths:  # keep root-to-leaf paths only, once each
            if nodes[-1] not in has_child and nodes[-1] not in seen:
                seen.add(nodes[-1])
                leaves.append(nodes)
        return cls(tuple(tokens), tuple(parents), tuple(depth), tuple(leaves))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> TokenTree:
        return cls.from_paths([tokens])

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        """Tokens on the deepest path (the number of draft positions this tree covers)."""
        return max((len(p) for p in self.paths), default=0)

    def mask(self) -> torch.Tensor:
        """`[N, N]` bool: row i is True at i and at its ancestors."""
        n = self.num_nodes
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(n):
            j = self.parents[i]
            while j >= 0:
                mask[i, j] = True
                j = self.parents[j]
        return mask

    def truncated(self, max_depth: int) -> TokenTree:
        """The tree without nodes at depth >= max_depth."""
        if self.max_depth <= max_depth:
            return self
        paths = [[self.tokens[n] for n in path[:max_depth]] for path in self.paths]
        return TokenTree.from_paths(paths)

    def best_chain(self) -> TokenTree:
        """Only the best path (the fallback for rows that sample)."""
        if len(self.paths) <= 1:
            return self
        return TokenTree.chain([self.tokens[n] for n in self.paths[0]])


@dataclass
class TreeDraft:
    """A batch of trees padded to the widest, the drafter's proposal in tree mode."""

    trees: list[TokenTree]
    tokens: torch.Tensor  # [B, N] long, pad nodes hold 0
    parents: torch.Tensor  # [B, N] long on the host, -1 for the root's children and pads
    depth: torch.Tensor  # [B, N] long on the host
    mask: torch.Tensor  # [B, N, N] bool on the host; pad nodes see only themselves
    num_nodes: torch.Tensor  # [B] long on the host

    @classmethod
    def from_trees(cls, trees: Sequence[TokenTree], device: torch.device | str = "cpu"):
        B, N = len(trees), max((t.num_nodes for t in trees), default=0)
        tokens = torch.zeros(B, N, dtype=torch.long)
        parents = torch.full((B, N), -1, dtype=torch.long)
        depth = torch.zeros(B, N, dtype=torch.long)
        mask = torch.eye(N, dtype=torch.bool).repeat(B, 1, 1)
        for b, tree in enumerate(trees):
            n = tree.num_nodes
            tokens[b, :n] = torch.tensor(tree.tokens, dtype=torch.long)
            parents[b, :n] = torch.tensor(tree.parents, dtype=torch.long)
            depth[b, :n] = torch.tensor(tree.depth, dtype=torch.long)
            mask[b, :n, :n] = tree.mask()
        num_nodes = torch.tensor([t.num_nodes for t in trees], dtype=torch.long)
        return cls(list(trees), tokens.to(device), parents, depth, mask, num_nodes)

    @property
    def lengths(self) -> torch.Tensor:
        """`[B]` draft positions per row: the depth of each row's deepest path."""
        return torch.tensor([t.max_depth for t in self.trees], dtype=torch.long)

    def truncated(self, max_depth: torch.Tensor) -> TreeDraft:
        """Each row cut to `max_depth[b]` levels."""
        trees = [t.truncated(int(d)) for t, d in zip(self.trees, max_depth.tolist(), strict=True)]
        return TreeDraft.from_trees(trees, self.tokens.device)

    def with_root(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position offsets `[B, 1+N]` and visibility `[B, 1+N, 1+N]` of the root (index
        0, offset 0) and the nodes (offset 1 + depth), the form `Transformer.forward`
        takes for a tree."""
        B, N = self.parents.shape
        offsets = torch.cat([torch.zeros(B, 1, dtype=torch.long), 1 + self.depth], 1)
        visible = torch.zeros(B, 1 + N, 1 + N, dtype=torch.bool)
        visible[:, :, 0] = True  # everyone sees the root
        visible[:, 1:, 1:] = self.mask
        pad = torch.arange(N)[None, :] >= self.num_nodes[:, None]  # [B, N]
        visible[:, 1:, 0] &= ~pad  # pad nodes see only themselves
        return offsets, visible


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
