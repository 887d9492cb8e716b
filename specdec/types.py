"""The runtime types a step passes between its parts: a chain `Draft` or a `TreeDraft`
(drafter -> engine -> acceptor), the acceptor's `Verdict`, and what the window sees of a
step (`Batch` before it, `StepRecord` after it). Plain values, so an acceptor or a window
can be driven by a test or a simulation as well as by the engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, k] long; positions >= lengths[b] hold any valid id
    probs: torch.Tensor | None  # [B, k, V] draft distribution q, or None (one-hot)
    lengths: torch.Tensor  # [B] long on the host, tokens really proposed per row (<= k)

    @property
    def k(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def empty(cls, rows: int, device: torch.device | str = "cpu") -> Draft:
        """No draft tokens (k = 0): the step is plain decoding."""
        return cls(
            tokens=torch.zeros(rows, 0, dtype=torch.long, device=device),
            probs=None,
            lengths=torch.zeros(rows, dtype=torch.long),
        )


@dataclass
class Verdict:
    tokens: torch.Tensor  # [B, k+1] long: accepted prefix + one new token, then -1 padding
    num_accepted: torch.Tensor  # [B] long, accepted draft tokens (emitted = num_accepted + 1)


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


@dataclass(frozen=True)
class Batch:
    """The next step's batch, as `Window.choose` sees it."""

    rows: int
    remaining: int = 0  # the most tokens any row may still generate
    catch_up: int = 0  # draft tokens a lazy drafter must feed before it can draft


@dataclass(frozen=True)
class StepRecord:
    """One decode step (or, with `prefilled`, one admission's prefill) as it ran.

    Per row (tuples of B): `drafted` the draft positions the row was asked for (the window
    capped by the row's tokens left; a tree: its deepest path), whether or not the drafter
    proposed them; `accepted` the drafts the target kept; `left` the tokens the row could
    still generate before the step and `left_after` after it (0 once finished). Seconds are
    wall time less one-off graph captures; `draft_s` excludes the catch-up pass.
    """

    rows: int
    k: int = 0  # the window chosen
    width: int = 1  # tokens per row of the verify pass (narrower than k + 1 when trimmed)
    drafted: tuple[int, ...] = ()  # [B]
    accepted: tuple[int, ...] = ()  # [B]
    left: tuple[int, ...] = ()  # [B]
    left_after: tuple[int, ...] = ()  # [B]
    whole_batch: bool = False  # the caller waits for the batch as a whole (`Engine.generate`)
    draft_s: float = 0.0
    first_s: float | None = None  # of draft_s, the first draft token's, where timed apart
    verify_s: float = 0.0
    catch_up_tokens: int = 0  # a lazy draft's catch-up pass in this step ...
    catch_up_s: float = 0.0  # ... and its seconds
    prefilled: tuple[int, ...] = ()  # [B] positions prefilled per admitted row (an admission)
    prefill_s: float = 0.0
    fresh: bool = False  # an admission into an empty batch
