"""Trained MLP speculator heads as a drafter (see `specdec.heads.mlp`).

Per row the drafter keeps two things: the target's final hidden state at the last position
in the target's KV cache (given by the engine through `observe` after every prefill and
verify pass) and the token sampled from that state, the last of the committed history
(given by `admit` and `commit`). From those it proposes a chain of up to n tokens, greedy
top-1 per head. The proposal is a deterministic function of the committed history, so q is
one-hot (`probs` None) and the lossless acceptors stay lossless, at any temperature.

With `tree=(4, 3, 2)` it proposes a candidate tree (`TreeDraft`, see
`specdec.heads.tree`) instead: all combinations of the top-k of each head, the best
`n_candidates` by summed log-probability, merged on shared prefixes; the engine verifies it
in one target pass, losslessly at any temperature (`TreeWalkSampler`: the argmax walk for
greedy rows, recursive rejection sampling over the children for rows that sample).
`sampled_tree=False` gives sampling rows only the best path (a chain) instead.

With a `learner` (`specdec.training.online.OnlineLearner`) the drafter also records the
target's kept states and tokens of its rows for the learner, reports how many of its
drafts were kept, and proposes with the learner's newest heads, taken once at the start of
each proposal (the swap: a step drafts with one version throughout); the learner trains in
the engine's time between steps (`between_steps`).

With `static_passes` the heads draft through `specdec.graphs.static_pass.StaticHeads`
(bucketed by rows over this drafter's own `hidden`/`last` tensors; CUDA graphs with
`cuda_graphs`, recaptured when the learner swaps in new heads).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.acceptors import Draft
from specdec.graphs.static_pass import StaticHeads, use_static_passes
from specdec.heads.tree import TreeDraft, check_tree, max_tree_nodes, tree_draft


class SpeculatorDrafter:
    def __init__(
        self,
        speculator,
        max_batch: int,
        device: torch.device | str = "cpu",
        tree: tuple[int, ...] | None = None,
        n_candidates: int | None = None,
        sampled_tree: bool = True,
        learner=None,
        static_passes: bool | None = None,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.speculator = speculator
        self.learner = learner
        self.recorder = None
        if learner is not None:
            self.recorder = learner.recorder()
        self._drafted = 0  # heads used in the latest proposal
        cfg = speculator.config
        self.n_predict = cfg.n_predict
        if tree is not None:
            tree, n_candidates = check_tree(tree, cfg.n_predict, n_candidates)
        self.tree = tree
        self.n_candidates = n_candidates
        self.sampled_tree = sampled_tree
        dtype = speculator.proj[0].weight.dtype
        self.hidden = torch.zeros(max_batch, cfg.emb_dim, dtype=dtype, device=device)  # [B, E]
        self.last = torch.zeros(max_batch, dtype=torch.long, device=device)  # [B]
        self.rows = 0
        # Static (graphs) by default on CUDA only, as the Engine's (`use_static_passes`).
        self.static_passes, self.cuda_graphs = use_static_passes(
            torch.device(device), static_passes, cuda_graphs
        )
        self._static: StaticHeads | None = None

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        """New rows; their hidden states arrive through `observe(hidden, first_row)`."""
        start, self.rows = self.rows, self.rows + len(histories)
        self.last[start : self.rows] = torch.tensor([h[-1] for h in histories])
        if self.recorder is not None:
            self.recorder.admit(histories)

    def observe(self, hidden: torch.Tensor, first_row: int = 0) -> None:
        """The target's final-normed state `[B, E]` at the last cached position of rows
        `first_row ..` (the state the last committed token was sampled from)."""
        self.hidden[first_row : first_row + len(hidden)] = hidden

    def observe_pass(self, states) -> None:
        """Drafts start from each row's last kept state; a learner records them all."""
        self.observe(states.last, states.first_row)
        if self.recorder is not None:
            self.recorder.record(states)

    @property
    def max_nodes(self) -> int:
        """The most tree nodes one row can propose (0 in chain mode)."""
        return 0 if self.tree is None else max_tree_nodes(self.tree, self.n_candidates)

    def propose(self, k, params, generators) -> Draft | TreeDraft:
        if self.learner is not None:
            self.speculator = self.learner.current  # the swap, between steps
        if self.static_passes and getattr(self._static, "speculator", None) is not self.speculator:
            self._static = StaticHeads(self.speculator, self.hidden, self.last, self.cuda_graphs)
        n = min(k, self.n_predict)
        self._drafted = n
        B = self.rows
        if n == 0:
            return Draft.empty(B, self.hidden.device)
        if self.tree is not None:
            return self._propose_tree(n, params)
        if self._static is not None:
            tokens = self._static.propose_greedy(B, n)  # [B, n]
        else:
            tokens = self.speculator.propose_greedy(self.hidden[:B], self.last[:B], n)
        return Draft(tokens, None, torch.full((B,), n, dtype=torch.long))

    def _propose_tree(self, n: int, params) -> TreeDraft:
        topk = self.tree[:n]
        B = self.rows
        if self._static is not None:
            paths, scores = self._static.propose_tree(B, topk)
        else:
            paths, scores = self.speculator.propose_tree(self.hidden[:B], self.last[:B], topk)
        return tree_draft(
            paths.cpu(),
            scores.cpu(),
            params,
            self.n_candidates,
            self.sampled_tree,
            self.hidden.device,
        )

    def commit(self, num_accepted, next_tokens) -> None:
        self.last[: self.rows] = next_tokens.to(self.last.device)
        if self.learner is not None:
            self.learner.record_step(self._drafted, num_accepted)
            self.recorder.commit(next_tokens)

    def between_steps(self, idle: bool = False) -> bool:
        return self.learner is not None and self.learner.between_steps(idle)

    def move_row(self, src: int, dst: int) -> None:
        self.hidden[dst] = self.hidden[src]
        self.last[dst] = self.last[src]
        if self.recorder is not None:
            self.recorder.move_row(src, dst)
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        if self.recorder is not None:
            self.recorder.reset_row(row)
        if row == self.rows - 1:
            self.rows -= 1
