"""An eagle head (`specdec.heads.eagle`) as a drafter.

Per row the drafter keeps the head's keys and values of the row's committed positions,
each entered with the target's true state there and the token that followed it. Those
arrive through `observe_pass` (the engine hands every kept position's state after each
prefill and verify pass) and wait as `pending` until a step drafts: a step with k = 0
feeds nothing, so a run that never speculates never runs the head.

A drafting step feeds each row's pending entries (one ragged pass; after a verify pass
that is the last committed position and the accepted drafts, after a prefill the whole
prompt). The newest entry's output is the first draft token; each later one feeds back
the head's predicted state with the token it drafted. Those speculative entries are
dropped at `commit`, since the true states of the accepted ones arrive next. Drafts are
greedy (top-1 of the draft vocabulary), a deterministic function of the committed history,
so q is one-hot (`probs` None) and the lossless acceptors stay lossless at any temperature.

With `tree=(3, 2, 1)` it proposes a candidate tree (`TreeDraft`, `specdec.heads.tree`)
instead, verified by the engine in one target pass: the top-3 tokens of the first draft
position, for each of them the top-2 of the next, and so on, each node's state computed
from its own path (the node's entry attends to the row's true entries and to its
ancestors' entries, held apart from the row's cache). Paths are scored by summed
log-probability over the draft vocabulary; each level keeps at most `n_candidates` nodes
(a beam: the work per level stays bounded) and the best `n_candidates` whole paths make
the tree. Offline, on the trainer's held-out chats, the trained eagle head's tokens per pass
went from 1.76 (a chain of 3) to 2.08 with (3, 2, 1) and 2.16 with (4, 2, 1).

With `static_passes` a drafting step (the pending entries' feed, then the n draft tokens
of a chain or the candidate tree) runs through `specdec.graphs.static_eagle.StaticEagle`:
fixed-shape passes over preallocated buffers, bucketed by rows, entries, tokens and key
span, captured as CUDA graphs on a GPU (`cuda_graphs`); eagerly over the same buffers on
the CPU. A step that feeds more than n_predict + 1 entries per row (a prefill's catch-up)
takes the eager path. Off by default until its graphs are checked on a GPU (`LLM` does
not ask for it yet).

With a `learner` (`specdec.training.online.OnlineLearner`) the drafter records its rows'
kept states and tokens for it, reports how many drafts were kept, and drafts with the
learner's newest head, taken at the start of each proposal.

With the engine's prefix store (`use_prefix_cache`) a prefill that reused a stored prompt
prefix hands over states only past it. This drafter's own store keeps the target's states
of recent prompts, keyed by their tokens as the target's keys and values are (a state
depends on the tokens up to its position), and gives back those of the reused prefix, so
the head's entries are what a full prefill would give. (Its entries themselves could not
be stored that way: entry j also depends on token j + 1, where two prompts that share j
positions part.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from specdec.acceptors import Draft
from specdec.drafters.base import PassStates
from specdec.errors import InvalidParameterError
from specdec.graphs.static_eagle import StaticEagle, expand_tree, node_step
from specdec.graphs.static_pass import use_static_passes
from specdec.heads.eagle import EagleHead
from specdec.heads.tree import TreeDraft, check_tree, max_tree_nodes, tree_draft
from specdec.models.prefix_cache import PrefixCache


class EagleDrafter:
    def __init__(
        self,
        head: EagleHead,
        max_batch: int,
        max_len: int,
        tree: Sequence[int] | None = None,
        n_candidates: int | None = None,
        sampled_tree: bool = True,
        learner=None,
        static_passes: bool = False,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.head = head
        self.learner, self.recorder = learner, None
        if learner is not None:
            self.recorder = learner.recorder()
        self._drafted = 0  # draft positions of the latest proposal
        c = head.config
        dtype, device = head.fc.weight.dtype, head.fc.weight.device
        self.n_predict = c.n_predict
        if tree is not None:
            tree, n_candidates = check_tree(tree, c.n_predict, n_candidates)
            if max(tree) > len(head.vocab_map):
                raise InvalidParameterError(
                    f"tree {tree}: top-k at most the head's {len(head.vocab_map)} draft ids"
                )
        self.tree, self.n_candidates, self.sampled_tree = tree, n_candidates, sampled_tree
        # Position max_len is the static passes' scratch slot: no span reaches it.
        shape = (max_batch, c.num_kv_heads, max_len + 1, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(max_batch, dtype=torch.long)  # true entries per row
        self.last: list[int] = []  # each row's newest committed token
        self.pending_states: list[list[torch.Tensor]] = []  # [n, E] pieces per row
        self.pending_tokens: list[list[int]] = []  # the token after each pending state
        # (entries, seconds) of the latest step's catch-up (entries beyond two per row),
        # which the engine takes out of the step's draft time. Unlike a draft model's it
        # is not priced before starting (`catch_up_tokens` is 0): all but each row's newest
        # entry need only their keys and values, a few percent of the layer.
        self.last_catch_up: tuple[int, float] = (0, 0.0)
        self.history: list[list[int]] = []  # each row's committed tokens
        self.admitted: list[bool] = []  # rows whose prefill's states have not come yet
        self.store: PrefixCache | None = None  # the target's states of recent prompts
        self.static_passes, self.cuda_graphs = use_static_passes(
            torch.device(device), static_passes, cuda_graphs
        )
        self._static: StaticEagle | None = None

    def catch_up_tokens(self) -> int:
        """A catch-up too cheap to price before starting (see `last_catch_up`)."""
        return 0

    def use_prefix_cache(self, store: PrefixCache) -> None:
        self.store = store

    def _features(self, states: PassStates) -> torch.Tensor:
        """`[B, T, F]`: what this head reads of a pass (the final states)."""
        return states.hidden

    @staticmethod
    def _as_cache(states: torch.Tensor) -> SimpleNamespace:
        """`states [n, E]` as one row of a one-layer cache: what `PrefixCache` copies
        (keys: the states; values: empty)."""
        n = len(states)
        return SimpleNamespace(
            k=[states[None, None]],
            v=[states.new_empty(1, 1, n, 0)],
            lengths=torch.tensor([n]),
        )

    def _restore_prefix(self, row: int, reused: int) -> None:
        """Queue the stored states of the first `reused` prompt positions of a new row
        (as many as the store holds; a shorter run leaves a gap the head skips over) and
        store the prompt's states once they are all known."""
        E = self.head.feature_size
        prompt = self.history[row][:-1]
        found = torch.empty(reused, E, dtype=self.k.dtype, device=self.k.device)
        got = 0
        if reused and self.store is not None:
            view = self._as_cache(found)
            view.lengths.zero_()
            got = self.store.load(view, 0, prompt[: reused + 1])
        if got:
            self.pending_states[row].insert(0, found[:got])
            self.pending_tokens[row][:0] = prompt[1 : got + 1]
        if got == reused and self.store is not None:
            states = torch.cat(self.pending_states[row]).to(self.k.dtype)
            self.store.save(self._as_cache(states), 0, prompt)

    @property
    def rows(self) -> int:
        return len(self.last)

    @property
    def max_nodes(self) -> int:
        """The most tree nodes one row can propose (0 in chain mode)."""
        return 0 if self.tree is None else max_tree_nodes(self.tree, self.n_candidates)

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        """New rows; their states arrive through `observe_pass` (the prefill's)."""
        if self.recorder is not None:
            self.recorder.admit(histories)
        for h in histories:
            self.last.append(int(h[-1]))
            self.history.append(list(h))
            self.admitted.append(True)
            self.pending_states.append([])
            self.pending_tokens.append([])

    def observe_pass(self, states: PassStates) -> None:
        """Queue each kept position's state with the token that followed it: the next
        kept token, or for the newest the row's committed token. A new row's prefill that
        skipped a stored prefix takes that prefix's entries from this drafter's store."""
        if self.recorder is not None:
            self.recorder.record(states)
        lengths = states.lengths.tolist()
        tokens = states.tokens.tolist()
        for i, n in enumerate(lengths):
            row = states.first_row + i
            after = tokens[i][1:n] + [self.last[row]]
            self.pending_states[row].append(self._features(states)[i, :n].clone())
            self.pending_tokens[row].extend(after)
            if self.admitted[row]:  # the prefill: it lacks the positions a stored prefix gave
                self.admitted[row] = False
                self._restore_prefix(row, max(0, len(self.history[row]) - 1 - n))
            else:  # a verify pass: the accepted drafts (a chain's or a tree path's) and
                self.history[row].extend(after)  # the committed token

    @torch.inference_mode()
    def propose(self, k, params, generators) -> Draft | TreeDraft:
        if self.learner is not None:
            self.head = self.learner.current  # the swap, between steps
        B = self.rows
        device = self.k.device
        self.last_catch_up = (0, 0.0)
        n = self._drafted = min(k, self.n_predict)
        if n == 0:
            return Draft.empty(B, device)
        started = time.perf_counter()
        feed = [len(t) for t in self.pending_tokens]
        if self.static_passes and max(feed) <= self.n_predict + 1:
            return self._propose_static(n, params)
        state = self._feed_pending()  # [B, E] f^ after each row's newest true entry
        if max(feed) > 2:
            self.last_catch_up = (sum(max(0, f - 2) for f in feed), time.perf_counter() - started)
        if self.tree is not None:
            return self._propose_tree(state, self.tree[:n], params)
        drafted = []
        for i in range(n):
            token = self.head.vocab_map[self.head.logits(state).argmax(-1)]  # [B]
            drafted.append(token)
            if i < n - 1:  # a speculative entry at position lengths + i
                x = self.head.inputs(token[:, None], state[:, None])
                state = self._step(x, torch.ones(B, dtype=torch.long), self.lengths[:B] + i)
        tokens = torch.stack(drafted, 1).cpu()  # [B, n]
        return Draft(tokens, None, torch.full((B,), n, dtype=torch.long))

    def _propose_static(self, n: int, params) -> Draft | TreeDraft:
        """A chain or a tree through the fixed-shape passes: the same drafts as the eager
        path. The feed is part of the step's one replay, so no catch-up is reported apart."""
        if getattr(self._static, "head", None) is not self.head:  # new, or the learner's swap
            self._static = StaticEagle(
                self.head, self.k, self.v, self.n_predict + 1, graphs=self.cuda_graphs
            )
        B = self.rows
        start = self.lengths[:B].clone()
        if self.tree is not None:
            paths, scores = self._static.propose_tree(
                self.pending_states, self.pending_tokens, start, self.tree[:n], self.n_candidates
            )  # [B, P, n], [B, P]
        else:
            tokens = self._static.propose(
                self.pending_states, self.pending_tokens, start, n
            )  # [B, n]
        self.lengths[:B] += torch.tensor([len(t) for t in self.pending_tokens])
        for row in range(B):
            self.pending_states[row], self.pending_tokens[row] = [], []
        if self.tree is not None:
            return self._tree_draft(paths, scores, params)
        return Draft(tokens.cpu(), None, torch.full((B,), n, dtype=torch.long))

    def _propose_tree(self, state: torch.Tensor, topk: tuple[int, ...], params) -> TreeDraft:
        """The candidate tree of `topk` from each row's state `[B, E]` (see the module
        docstring): levels expanded as a beam of at most `n_candidates` nodes per row
        (`specdec.graphs.static_eagle.expand_tree`, which the static passes run too)."""
        B = self.rows
        lengths = self.lengths[:B].to(state.device)
        span = int(self.lengths[:B].max())

        def step(x, depth, chain):
            return node_step(self.head, self.k, self.v, x, depth, chain, lengths, span)

        paths, scores = expand_tree(self.head, state, topk, self.n_candidates, step)
        return self._tree_draft(paths, scores, params)

    def _tree_draft(self, paths: torch.Tensor, scores: torch.Tensor, params) -> TreeDraft:
        return tree_draft(
            paths.cpu(), scores.cpu(), params, self.n_candidates, self.sampled_tree, paths.device
        )

    def _feed_pending(self) -> torch.Tensor:
        """One ragged pass over every row's pending entries; `[B, E]` the head's state
        after each row's newest one. Every row has at least one (its newest position)."""
        B, dtype = self.rows, self.k.dtype
        counts = torch.tensor([len(t) for t in self.pending_tokens], dtype=torch.long)
        T = int(counts.max())
        E = self.head.feature_size
        feats = torch.zeros(B, T, E, dtype=dtype, device=self.k.device)
        nexts = torch.zeros(B, T, dtype=torch.long, device=self.k.device)
        for row in range(B):
            n = int(counts[row])
            feats[row, :n] = torch.cat(self.pending_states[row]).to(dtype)
            nexts[row, :n] = torch.tensor(self.pending_tokens[row])
            self.pending_states[row], self.pending_tokens[row] = [], []
        x = self.head.entries(nexts, feats)  # [B, T, E]
        state = self._step(x, counts, self.lengths[:B])
        self.lengths[:B] += counts
        return state

    def _step(self, x: torch.Tensor, counts: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Write `x [B, T, E]` (row b's first `counts[b]` entries) at positions
        `start[b] ..` and return the head's state `[B, E]` after each row's last one,
        which attends to the row's entries up to itself.

        Only that last entry runs the whole layer: with one layer, an entry's key and
        value depend on its input alone, so the earlier entries of a catch-up need only
        their keys and values (3 of the layer's ~50M weights per entry for the 1.5B), and
        only the last one's query (`EagleHead.kv`)."""
        head = self.head
        B, T, _ = x.shape
        offsets = torch.arange(T)
        positions = start[:, None] + offsets  # [B, T]
        valid = offsets[None, :] < counts[:, None]
        last = counts - 1  # [B]: each row's last new entry
        at = torch.arange(B), last.to(x.device)
        if T == 1:
            q, k, v = head.qkv(x, positions.to(x.device))  # [B, H, 1, D], [B, Hkv, 1, D] x 2
        else:
            k, v = head.kv(x, positions.to(x.device))  # [B, Hkv, T, D] x 2
            newest = positions[torch.arange(B), last][:, None].to(x.device)  # [B, 1]
            q = head.qkv(x[at][:, None], newest)[0]  # [B, H, 1, D]
        rows, cols = valid.nonzero(as_tuple=True)
        slots = positions[rows, cols]
        self.k[rows, :, slots] = k.transpose(1, 2)[rows, cols]
        self.v[rows, :, slots] = v.transpose(1, 2)[rows, cols]
        span = int((start + counts).max())
        mask = torch.arange(span)[None, :] <= (start + last)[:, None]  # [B, span]
        out = head.attend(
            q,  # [B, H, 1, D]: each row's last entry's
            self.k[:B, :, :span],
            self.v[:B, :, :span],
            mask=mask[:, None, None].to(x.device),
        )  # [B, 1, E]
        return head.after_attention(x[at][:, None], out)[:, 0]

    def commit(self, num_accepted, next_tokens) -> None:
        """The speculative entries go (the accepted drafts' true states come next, with
        their tokens, through `observe_pass`); the committed token follows each row's
        newest state."""
        self.last[:] = [int(t) for t in next_tokens.tolist()]
        if self.learner is not None:
            self.learner.record_step(self._drafted, num_accepted)
            self.recorder.commit(next_tokens)

    def between_steps(self, idle: bool = False) -> bool:
        return self.learner is not None and self.learner.between_steps(idle)

    def move_row(self, src: int, dst: int) -> None:
        if self.recorder is not None:
            self.recorder.move_row(src, dst)
        n = int(self.lengths[src])
        self.k[dst, :, :n] = self.k[src, :, :n]
        self.v[dst, :, :n] = self.v[src, :, :n]
        self.lengths[dst] = n
        for rows in self._per_row():
            rows[dst] = rows[src]
        self.reset_row(src)

    def _per_row(self) -> tuple[list, ...]:
        return (
            self.last,
            self.history,
            self.admitted,
            self.pending_states,
            self.pending_tokens,
        )

    def reset_row(self, row: int) -> None:
        if self.recorder is not None:
            self.recorder.reset_row(row)
        self.lengths[row] = 0
        if row == self.rows - 1:
            for rows in self._per_row():
                rows.pop()
        else:
            self.pending_states[row], self.pending_tokens[row] = [], []
            self.history[row] = []
