"""A small model sharing the target's tokenizer drafts k tokens autoregressively.

Its KV cache follows the committed history minus tokens it has not seen yet (`pending`):
normally just the target's newest token, but when all k drafts were accepted also the last
draft token, which was sampled and never fed. The first draft forward of a step therefore
takes one or two tokens per row (a ragged batch), the next k-1 take one each.

The prefill is lazy: `admit` only queues a new row's whole history as pending, and steps
with k = 0 only append to it, so a run that never speculates never runs the draft model.
The first step with k > 0 catches the rows up (`_catch_up`): one ragged pass (or passes of
`prefill_chunk` positions, as the target's prefill) over the rows whose pending history
is long, feeding all but its last token, which the step's
first draft forward then takes like any other. `--speculate auto` prices that pass before
it starts (`catch_up_tokens`, `last_catch_up`). A row's history that starts like one the
drafter has caught up on before (`use_prefix_cache`) copies those keys and values instead.

With `static_passes` the draft steps (one or two tokens per row, then one) run through
`specdec.graphs.static_pass.StaticPasses` over this drafter's cache, captured as CUDA
graphs with `cuda_graphs`; the catch-up pass (long, rare, not at row 0) stays eager.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from specdec.acceptors import Draft
from specdec.drafters.draft_vocab import ContextIds
from specdec.errors import TokenizerMismatchError
from specdec.graphs.static_pass import StaticPasses, use_static_passes
from specdec.models.kv_cache import KVCache
from specdec.models.prefix_cache import PrefixCache
from specdec.models.transformer import Transformer, pass_spans, right_pad
from specdec.processors import process_logits
from specdec.sampling import param_tensors, probs_from_logits, sample


def check_same_tokenizer(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a draft whose token ids mean something else than the target's."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = sorted(
        (t for t in set(target_vocab) ^ set(draft_vocab)),
        key=lambda t: target_vocab.get(t, draft_vocab.get(t, 0)),
    )[:5]
    if not differing:
        differing = [t for t in target_vocab if target_vocab[t] != draft_vocab[t]][:5]
    raise TokenizerMismatchError(
        f"the draft model's tokenizer differs from the target's ({len(target_vocab)} vs "
        f"{len(draft_vocab)} tokens; e.g. {differing}): a draft must share the tokenizer"
    )


class DraftModelDrafter:
    def __init__(
        self,
        model: Transformer,
        target_vocab_size: int,
        tokenizer_size: int,
        max_batch: int,
        max_len: int,
        static_passes: bool | None = None,
        cuda_graphs: bool | None = None,
        vocab: torch.Tensor | None = None,
        context_rows=None,
        prefill_chunk: int | None = None,
    ) -> None:
        self.model = model
        # The catch-up runs in passes of at most this many positions, as the target's
        # prefill does (`Engine.prefill_chunk`; None: one pass).
        self.prefill_chunk = prefill_chunk
        # The KV cache and the draft steps' forward (at most two new tokens per row, the
        # pending ones; static, as graphs, by default on CUDA only, as the Engine's) are
        # built by the first step that drafts (`cache`): a run that never speculates
        # allocates what plain decoding does.
        self.max_batch, self.max_len = max_batch, max_len
        self._static = use_static_passes(model.device, static_passes, cuda_graphs)
        self._cache: KVCache | None = None
        self._forward = model
        # Ids past the tokenizer's are padding rows of an embedding matrix: never draft them,
        # and give q the target's width so p and q line up.
        self.usable_vocab = min(tokenizer_size, model.config.vocab_size, target_vocab_size)
        self.target_vocab_size = target_vocab_size
        # A pruned vocabulary head (`prune_vocab_head`) scores only the ids `vocab` [N]:
        # q is the softmax over them, zero elsewhere, still a distribution the acceptor
        # corrects, so the output does not change (only how often a draft is kept).
        self.vocab = None if vocab is None else vocab.to(model.device)
        if self.vocab is not None and int(self.vocab.max()) >= self.usable_vocab:
            raise ValueError(f"draft vocabulary ids must be below {self.usable_vocab}")
        # With `context_rows` (ids -> a layer over those rows of the head before the cut:
        # `draft_vocab.head_rows`), the ids of the rows' own histories that the cut left
        # out are scored too (`ContextIds`): the logit columns are `self.context.ids`.
        self.context = (
            ContextIds(context_rows, self.vocab, self.usable_vocab)
            if self.vocab is not None and context_rows is not None
            else None
        )
        self.pending: list[list[int]] = []
        self._k = 0  # window of the current step
        self._draft = torch.zeros(0, 0, dtype=torch.long)  # [B, k] tokens of the current step
        self._start = torch.zeros(0, dtype=torch.long)  # [B] cache lengths before the step
        # (tokens, seconds) of the latest step's catch-up pass ((0, 0.0): none): the engine
        # takes it out of the step's draft time and prices the next start-up with it.
        self.last_catch_up: tuple[int, float] = (0, 0.0)
        # Seconds of the latest step's first draft token (its pass feeds one or two tokens
        # per row, the later ones one): `auto` prices the two apart.
        self.last_first_s: float | None = None
        self.prefix_cache: PrefixCache | None = None

    @property
    def cache(self) -> KVCache:
        """The draft's KV cache, allocated at first use. Why lazily: at int4 4 x 256 the
        bench read draft-auto's prefill, the same target call as plain's, at a median
        1.12x plain's time over 18 turns while the drafter held its cache unused, and
        1.01x with it allocated here (the mechanism, heap placement, untraced)."""
        if self._cache is None:
            # Normal tensors, as when built with the drafter: the first step that drafts
            # runs in inference mode, whose tensors refuse the writes of a `commit` outside.
            with torch.inference_mode(False):
                self._cache = self.model.new_cache(self.max_batch, self.max_len)
            static, graphs = self._static
            if static:
                self._forward = StaticPasses(
                    self.model, self._cache, self.max_batch, 2, graphs=graphs
                )
        return self._cache

    def _cached(self, row: int) -> int:
        """Positions of `row` in the draft's cache (0 before the cache exists)."""
        return 0 if self._cache is None else int(self._cache.lengths[row])

    def use_prefix_cache(self, store: PrefixCache) -> None:
        self.prefix_cache = store

    @property
    def rows(self) -> int:
        return len(self.pending)

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        """Queue the new rows' whole histories: nothing runs until a step speculates
        (auto may never start, or a short generation may not repay the prefill)."""
        self.pending.extend(list(h) for h in histories)
        if self.context is not None:
            self.context.admit(histories)

    def _behind(self) -> list[int]:
        """Rows whose pending history is longer than a step's usual one or two tokens."""
        return [row for row, p in enumerate(self.pending) if len(p) > 2]

    def catch_up_tokens(self) -> int:
        """Tokens a step with k > 0 would feed now beyond the usual one or two per row:
        the size of the catch-up pass that starting to speculate costs."""
        return sum(len(self.pending[row]) - 1 - self._reusable(row) for row in self._behind())

    def _reusable(self, row: int) -> int:
        """Pending positions of an empty row the prefix store holds (never the last one)."""
        if self.prefix_cache is None or self._cached(row) != 0:
            return 0
        return self.prefix_cache.match(self.pending[row][:-1])

    @torch.inference_mode()
    def _catch_up(self) -> None:
        """Feed all but the last pending token of each row whose pending history is long,
        in one ragged pass over the rows from the first to the last of them (rows between
        that are caught up take no tokens; padding writes to the cache's scratch slot)."""
        behind = self._behind()
        if not behind:
            return
        started = time.perf_counter()
        lo, hi = behind[0], behind[-1] + 1
        store = self.prefix_cache
        histories = {row: self.pending[row][:-1] for row in behind}
        if store is not None:  # rows starting like an earlier one copy that prefix first
            for row in behind:
                if int(self.cache.lengths[row]) == 0:
                    reused = store.load(self.cache, row, histories[row])
                    self.pending[row] = self.pending[row][reused:]
        feed = [self.pending[row][:-1] if row in behind else [] for row in range(lo, hi)]
        tokens, fed = right_pad(feed, self.model.device)  # [hi - lo, T], [hi - lo]
        for start, stop, num_new in pass_spans(fed, self.prefill_chunk):  # the target's passes
            self.model(
                tokens[:, start:stop],
                self.cache,
                num_new=num_new,
                logits_at=torch.zeros(hi - lo, 1, dtype=torch.long),
                first_row=lo,
            )
        for row in behind:
            self.pending[row] = self.pending[row][-1:]
            if store is not None and len(histories[row]) == int(self.cache.lengths[row]):
                store.save(self.cache, row, histories[row])
        self.last_catch_up = (int(fed.sum()), time.perf_counter() - started)

    @torch.inference_mode()
    def propose(self, k, params, generators) -> Draft:
        B, device = self.rows, self.model.device
        self._k = k
        self.last_catch_up = (0, 0.0)
        self.last_first_s = None
        if k == 0:  # speculation is off this step: feed nothing, let pending grow
            return Draft.empty(B, device)
        cache = self.cache  # allocated at the first step that drafts, before its timing
        self._catch_up()
        started = time.perf_counter()
        self._start = cache.lengths[:B].clone()
        tokens, fed = right_pad(self.pending, device)
        temps = param_tensors(params, device)
        greedy = [p.greedy for p in params]
        out = self._forward(tokens, cache, num_new=fed, logits_at=(fed - 1)[:, None])
        logits = self._logits(out, fed - 1)
        drafted, qs = [], []
        for i in range(k):
            logits = self._processed(logits, drafted)
            if all(greedy):  # q is one-hot at the argmax: the Draft says so with probs None
                drafted.append(self._argmax(logits))
            else:
                q = self._distribution(logits, temps)  # [B, V_target]
                drafted.append(sample(q, generators, greedy))
                qs.append(q)
            if i == 0:
                self.last_first_s = time.perf_counter() - started
            if i < k - 1:
                logits = self._logits(self._forward(drafted[-1][:, None], cache))
        self._draft = torch.stack(drafted, 1)  # [B, k]
        probs = torch.stack(qs, 1) if qs else None  # [B, k, V_target]
        return Draft(self._draft, probs, torch.full((B,), k, dtype=torch.long))

    def use_processors(self, processors) -> None:
        """The rows' logits processors, for this step's drafts (`drafters.base`)."""
        self._processors = processors

    def _processed(self, logits: torch.Tensor, drafted: list[torch.Tensor]) -> torch.Tensor:
        """The rows' processors on the draft's `logits [B, V_draft]` after `drafted` (this
        step's drafts so far, `[B]` each). A cut head's logits ([B, N] over `_columns`) go
        through them laid out over the target's ids (-inf elsewhere) and come back: a draft
        outside a grammar's mask is a wasted position (JSON mode drafted 1.0-1.15x plain
        while the default cut head ignored the grammar)."""
        processors = getattr(self, "_processors", None)
        if not processors or all(p is None for p in processors):
            return logits
        so_far = torch.stack(drafted, 1).tolist() if drafted else [[] for _ in processors]
        paths = [[row] for row in so_far]
        if self.vocab is None:
            return process_logits(logits[:, None], processors, paths)[:, 0]
        full = self._over_target(logits, float("-inf"))  # [B, V_target]
        return process_logits(full[:, None], processors, paths)[:, 0, self._columns]

    def _logits(self, out, at: torch.Tensor | None = None) -> torch.Tensor:
        """The draft's logits [B, V_draft] (or [B, N] over the cut head's columns) at each
        row's position `at` [B] (the only one when None)."""
        logits = out.logits[:, 0]
        if self.context is None:
            return logits
        rows = torch.arange(logits.shape[0], device=logits.device)
        hidden = out.hidden[:, 0] if at is None else out.hidden[rows, at.to(logits.device)]
        return self.context.logits(logits, hidden)

    @property
    def _columns(self) -> torch.Tensor | None:
        """The id of each logit column of a cut head ([N] or [N + M]); None uncut."""
        return self.vocab if self.context is None else self.context.ids

    def _over_target(self, cut: torch.Tensor, fill: float) -> torch.Tensor:
        """A cut head's `cut [B, N]` laid out over the target's ids [B, V_target], `fill`
        at the ids it does not score."""
        full = cut.new_full((cut.shape[0], self.target_vocab_size), fill)
        return full.index_copy_(1, self._columns, cut)

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy rows' draft tokens [B]: the token `_distribution`'s one-hot q would pick,
        without building it (measured on the 0.5B draft of Qwen's 152k ids: 1.0 ms a draft
        token for q and its sampling, 5% of an int4 draft step)."""
        if self.vocab is not None:
            return self._columns[logits.argmax(-1)]
        return logits[:, : self.usable_vocab].argmax(-1)

    def _distribution(self, logits: torch.Tensor, temps) -> torch.Tensor:
        """Draft logits [B, V_draft] (or [B, N] over `vocab`) -> q [B, V_target]."""
        if self.vocab is not None:
            return self._over_target(probs_from_logits(logits, *temps), 0.0)  # [B, V_target]
        logits = logits[:, : self.usable_vocab]
        q = probs_from_logits(logits, *temps)
        pad = self.target_vocab_size - q.shape[1]
        return torch.nn.functional.pad(q, (0, pad)) if pad else q

    def commit(self, num_accepted, next_tokens) -> None:
        """Keep the cache through the accepted drafts it has seen; queue the rest."""
        k, nexts = self._k, next_tokens.tolist()
        if k == 0:
            for row, nxt in enumerate(nexts):
                self.pending[row].append(nxt)
                if self.context is not None:
                    self.context.add(row, [nxt])
            return
        accepted = num_accepted.cpu()
        fed = torch.tensor([len(p) for p in self.pending])
        # The last draft token was sampled but never fed, so at most k-1 drafts are cached.
        self.cache.truncate(self._start + fed + accepted.clamp(max=k - 1))
        last_draft = self._draft[:, k - 1].tolist()
        for row, (n, nxt) in enumerate(zip(accepted.tolist(), nexts, strict=True)):
            self.pending[row] = ([last_draft[row]] if n == k else []) + [nxt]
            if self.context is not None:
                self.context.add(row, self._draft[row, :n].tolist() + [nxt])

    def commit_foreign(self, num_accepted, next_tokens, foreign: dict[int, list[int]]) -> None:
        """`commit`, where the rows in `foreign` (row -> its draft tokens) verified another
        drafter's draft this step (`drafters.hybrid`): the cache keeps none of this
        drafter's own drafts for them, and their accepted tokens queue as pending, fed at
        the next step that drafts (a catch-up pass when there are many)."""
        accepted = num_accepted.cpu().clone()
        for row in foreign:
            accepted[row] = 0
        self.commit(accepted, next_tokens)
        for row, tokens in foreign.items():
            taken = tokens[: int(num_accepted[row])]
            nxt = self.pending[row].pop()
            self.pending[row].extend([*taken, nxt])
            if self.context is not None:
                self.context.add(row, taken)

    def move_row(self, src: int, dst: int) -> None:
        if self._cache is not None:
            self._cache.move_row(src, dst)
        self.pending[dst] = self.pending[src]
        if self.context is not None:
            self.context.move_row(src, dst)
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        if self._cache is not None:
            self._cache.reset_row(row)
        if self.context is not None:
            self.context.reset_row(row)
        if row == self.rows - 1:
            self.pending.pop()
        else:
            self.pending[row] = []
