"""The decoding engine: requests in, completions out, speculatively when given a drafter.

`Engine` runs requests (token ids) on a native `Transformer` with continuous batching:
requests queue, join the running batch between steps and leave it when done. Live
sequences are kept packed in the first rows of the KV cache (and of the drafter's state); a
sequence that finishes hands its row to the last live one, so no model computes a finished
row, and a waiting request takes the freed row at the next step.

Plain decoding is the k = 0 case of the speculative step: one step per token.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import TypeVar

import torch

from specdec.acceptors import Draft, GreedyAcceptor, RejectionSampler, TokenAcceptor
from specdec.drafters.base import Drafter, DrafterPowers, PassStates, UsesPrefixCache
from specdec.errors import ContextLengthError, InvalidParameterError
from specdec.grammar import GrammarCompiler
from specdec.graphs.static_pass import StaticPasses, capture_seconds, use_static_passes
from specdec.heads.tree import TreeDraft, TreeWalkSampler
from specdec.models.kv_cache import KVCache
from specdec.models.prefix_cache import PrefixCache
from specdec.models.transformer import Transformer
from specdec.params import SamplingParams
from specdec.prefill import prefill_passes
from specdec.processors import RequestProcessor
from specdec.sampling import make_generator
from specdec.sequence import (
    Completion,
    LiveSequence,
    drop_finished,
    postpone,
    tokens_left,
)
from specdec.tokenization import StopChecker
from specdec.types import Batch, StepRecord
from specdec.verify import verify_chain, verify_tree
from specdec.window import FixedWindow, PricesModels, Window


class Engine:
    """Continuous-batching decoding over a native transformer; speculative with a drafter.

    Requests wait in a FIFO queue and join the running batch between steps (`step`), up to
    `max_batch` rows; each keeps its own sampling parameters and generator. Each step
    follows Algorithm 1 of Leviathan et al.: the drafter proposes k tokens per row, the
    target scores all k+1 positions in one pass, the acceptor keeps a prefix plus one
    token, and both caches roll back to what was kept. `window` chooses k per step for the
    batch at hand (the `auto` policy weighs the batch's verify cost); each row's draft is
    then cut to what it can still use.

    `max_len` fixes the KV cache's length per row (a server's memory budget); left None,
    the cache is sized, whenever the engine is idle, to the longest waiting request.

    A drafter may propose a candidate tree (`TreeDraft`) instead of a chain: the engine
    then verifies every node in one pass (`verify.verify_tree`); `max_tree_nodes` (the drafter's
    `max_nodes`) reserves cache room for the widest tree.

    `prefix_cache_tokens` > 0 keeps that many positions of recent prompts' and finished
    requests' keys and values (`specdec.models.prefix_cache`), for the target and for a
    draft model each: a request that starts like one of them prefills only the rest.

    `prefill_chunk` prefills an admission in passes of at most that many positions, its
    rows sharing them (`LLM` and the CLI default to `prefill.PREFILL_CHUNK_CPU` on a CPU);
    `generate_steps` yields between them.

    `static_passes` runs the target's decode and verify passes through fixed-shape,
    bucketed passes over preallocated buffers (`specdec.graphs.static_pass`), and
    `cuda_graphs` captures them as CUDA graphs. Both default to on for a CUDA model and
    off on the CPU, where the eager pass is unchanged (`cuda_graphs` is ignored there;
    `static_passes=True` runs the buffered path eagerly, which is how CPU tests check it).
    They keep no layer inputs: with a drafter that reads them (`ReadsLayerInputs`, an
    EAGLE-3 head) the target runs its eager passes.
    With graphs the passes run the model's `layer_stack`: by default the faster of its
    own layers and the compiled ones (`specdec.graphs.fused_layers`), raced at capture.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer,
        eos_ids: frozenset[int],
        max_batch: int = 8,
        drafter_factory=None,
        acceptor: TokenAcceptor | None = None,
        window: Window | None = None,
        max_len: int | None = None,
        max_tree_nodes: int = 0,
        tree_acceptor=None,
        static_passes: bool | None = None,
        cuda_graphs: bool | None = None,
        prefix_cache_tokens: int = 0,
        prefill_chunk: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise InvalidParameterError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        # The most positions one prefill pass computes, its rows together, each an equal
        # share (None: an admission in one pass). Longer admissions are prefilled in passes
        # over the growing cache: what one pass allocates stays bounded (on the CPU, the
        # large tensors of one long pass come from fresh pages each time:
        # `prefill.PREFILL_CHUNK_CPU`),
        # and `generate_steps` yields between passes, so the benchmark's engines take turns
        # inside a long prefill too.
        self.prefill_chunk = prefill_chunk
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_batch = max_batch
        # drafter_factory(max_batch, max_len) -> Drafter: drafters size their state per batch.
        self.drafter_factory = drafter_factory
        # Wall seconds spent admitting requests (the target's prefill; a draft model's is
        # lazy, a catch-up inside the first speculative step), over the
        # engine's life: what the benchmarks subtract to time the decode phase alone.
        self.prefill_s = 0.0
        if prefix_cache_tokens < 0:
            raise InvalidParameterError(
                f"prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}"
            )
        # Keys and values of recent sequences, the target's and a draft model's; they
        # outlive the caches `_ensure_cache` rebuilds.
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
        self.draft_prefix_cache = (
            PrefixCache(prefix_cache_tokens) if prefix_cache_tokens and drafter_factory else None
        )
        self.acceptor = acceptor or RejectionSampler()
        self.window = window or FixedWindow(0)
        if drafter_factory is None and self.window.k_max:
            raise InvalidParameterError("speculation needs a drafter (--draft MODEL|ngram)")
        if not isinstance(self.acceptor, TokenAcceptor):
            raise InvalidParameterError(
                f"{type(self.acceptor).__name__} is not a TokenAcceptor: it needs a "
                "`lossless` attribute and __call__(draft, target_probs, generators)"
            )
        # Headroom: a verify pass writes k+1 positions past a row's length before rollback
        # (a tree: its root and up to `max_tree_nodes`, the drafter's `max_nodes`).
        self.max_tree_nodes = max_tree_nodes
        # Trees are verified by a tree acceptor: the lossless walk (argmax at every node
        # when the chain acceptor is greedy). A user acceptor for chains has no tree form.
        if tree_acceptor is None and isinstance(self.acceptor, (RejectionSampler, GreedyAcceptor)):
            tree_acceptor = TreeWalkSampler(argmax=isinstance(self.acceptor, GreedyAcceptor))
        self.tree_acceptor = tree_acceptor
        self.headroom = max(self.window.k_max, max_tree_nodes) + 2
        if max_len is not None and not self.headroom < max_len:
            raise InvalidParameterError(f"max_len must exceed {self.headroom}, got {max_len}")
        self.max_len = max_len
        self.live: list[LiveSequence] = []  # live[i] owns cache row i (and drafter row i)
        self.waiting: deque[LiveSequence] = deque()
        # Inside `generate`: the caller waits for every request, so once none waits the
        # batch is done when its longest row is (`StepRecord.whole_batch`).
        self._one_job = False
        self._cache: KVCache | None = None
        self._drafter: Drafter | None = None
        self._powers = DrafterPowers.of(None)  # the drafter's optional powers
        self._pricer = self.window if isinstance(self.window, PricesModels) else None
        self.last_window = 0  # k of the latest step, for monitoring
        self.static_passes, self.cuda_graphs = use_static_passes(
            model.device, static_passes, cuda_graphs
        )
        # The target's decode/verify pass: the model itself, or `StaticPasses` over the
        # current cache (chosen once per cache, in `_ensure_cache`).
        self._target = model
        # Grammars for constrained requests, over the logits' columns (built at first use).
        self.vocab_size = model.config.vocab_size
        self._grammars: GrammarCompiler | None = None

    @property
    def grammars(self) -> GrammarCompiler:
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_ids)
        return self._grammars

    @property
    def context_length(self) -> int:
        return self.model.config.max_position_embeddings

    @property
    def has_work(self) -> bool:
        return bool(self.live or self.waiting)

    def check_fits(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Refuse, before any work, a request that cannot fit the model's context (or the
        engine's fixed `max_len`)."""
        n, ctx = len(prompt_ids), self.context_length
        if n == 0:
            raise InvalidParameterError("the prompt is empty (it must have at least one token)")
        if n >= ctx:
            raise ContextLengthError(
                f"the prompt has {n} tokens but the model's context is {ctx} tokens"
            )
        if n + params.max_tokens > ctx:
            raise ContextLengthError(
                f"the prompt has {n} tokens and max_tokens is {params.max_tokens}: "
                f"{n + params.max_tokens} exceeds the model's context of {ctx} tokens"
            )
        if self.max_len is not None and n + params.max_tokens > self.max_len - self.headroom:
            raise ContextLengthError(
                f"the prompt has {n} tokens and max_tokens is {params.max_tokens}: "
                f"{n + params.max_tokens} exceeds this engine's limit of "
                f"{self.max_len - self.headroom} tokens per sequence (its max_len)"
            )
        if params.logit_bias and params.logit_bias[-1][0] >= self.vocab_size:
            raise InvalidParameterError(
                f"logit_bias: token id {params.logit_bias[-1][0]} is outside the "
                f"vocabulary (ids < {self.vocab_size})"
            )
        if params.grammar is not None:
            self.grammars.compile(params.grammar)  # InvalidParameterError if it cannot

    def add_request(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> LiveSequence:
        """Queue a request; it joins the batch at a coming `step`. Checked here, so a bad
        request never reaches the batch."""
        self.check_fits(prompt_ids, params)
        seq = LiveSequence(
            list(prompt_ids),
            params,
            make_generator(params.seed, self.model.device),
            StopChecker(self.tokenizer, params.stop),
            request_id=request_id,
        )
        if params.processed:
            grammars = self.grammars if params.grammar is not None else None
            seq.processor = RequestProcessor(params, self.vocab_size, self.model.device, grammars)
        if params.logprobs is not None:
            seq.logprobs = []
        self.waiting.append(seq)
        return seq

    def reset(self) -> None:
        """Drop every request, live or waiting, and the caches (after a failed step)."""
        for seq in [*self.live, *self.waiting]:
            self.abort(seq)
        self.live.clear()
        self.waiting.clear()
        self._cache = self._drafter = None
        self._target = self.model

    def abort(self, seq: LiveSequence) -> None:
        """Stop a request (a client went away); its row is freed at the next step."""
        if seq.finished:
            return
        seq.finish_reason = "abort"
        seq.finished_at = time.perf_counter()
        if seq in self.waiting:
            self.waiting.remove(seq)

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
    ) -> list[Completion]:
        """Generate for each prompt (token ids), `max_batch` sequences at a time: a row
        freed by a finished sequence is taken by the next waiting one at the next step."""
        return _drained(self.generate_steps(prompts, params))

    def generate_steps(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
    ) -> Generator[None, None, list[Completion]]:
        """`generate`, one scheduling step at a time: the requests are checked and queued
        now; the generator runs a `step` per `next` and returns the completions. Lets a
        caller take turns between engines step by step: the benchmark's `--interleave
        steps` pairs two methods' steps a few tens of milliseconds apart, where their
        whole runs would see different minutes of a shared host. The requests' times
        (TTFT, elapsed) count this engine's steps only, not the caller's time between
        `next`s. With `prefill_chunk` a long admission also yields between its passes."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidParameterError("give one SamplingParams, or one per prompt")
        for ids, p in zip(prompts, params, strict=True):
            self.check_fits(ids, p)
        seqs = [self.add_request(ids, p) for ids, p in zip(prompts, params, strict=True)]
        return self._run_job(seqs, time.perf_counter())

    def _run_job(
        self, seqs: list[LiveSequence], queued_at: float
    ) -> Generator[None, None, list[Completion]]:
        self._one_job = True
        away = queued_at  # the caller's time runs from the call to the first next
        try:
            while any(not s.finished for s in seqs):
                postpone([s for s in seqs if not s.finished], time.perf_counter() - away)
                # admit, a turn between prefill passes
                yield from self.admit_steps(caller_time=True)
                self.decode()
                away = time.perf_counter()
                yield
        finally:
            self._one_job = False
        return [self.completion(s) for s in seqs]

    def step(self) -> list[LiveSequence]:
        """One scheduling step: `admit` then `decode`, the live rows also decoding between
        the passes of a chunked prefill (`admit_steps`). Returns the sequences that gained
        tokens or finished in this step."""
        touched, admission = [], self.admit_steps()
        while True:
            try:
                next(admission)
            except StopIteration as done:
                touched += done.value
                break
            touched += self.decode()
        return list(dict.fromkeys(touched + self.decode()))

    def admit(self) -> list[LiveSequence]:
        """Free the rows of aborted sequences and admit waiting requests, prefilling them
        together (each gets its first token). A server streams those first tokens before
        the next `decode`, so time to first token is one prefill, not prefill + step."""
        return _drained(self.admit_steps())

    @torch.inference_mode()  # on a generator: inside each resume only, not between them
    def admit_steps(self, caller_time: bool = False) -> Generator[None, None, list[LiveSequence]]:
        """`admit`, yielding between the passes of a chunked prefill. At a yield the caller
        may run `decode` (the live rows take a step, so a long prompt delays them by one
        pass, not by its whole prefill); the admitted rows join after the last pass.
        `caller_time`: the time at a yield is not the engine's (a benchmark's turns), so it
        counts in no request's clock."""
        touched = [s for s in self.live if s.finished]  # aborted since the last step
        self._drop_finished()
        return touched + (yield from self._admission(caller_time))

    @torch.inference_mode()
    def decode(self) -> list[LiveSequence]:
        """One speculative step over every live row; returns them (finished ones too)."""
        if not self.live:
            return []
        touched = list(self.live)
        self._step(self.live, self._cache, self._drafter)
        self._drop_finished()
        if self._powers.learns is not None:  # after the step's timings: not a cost to price
            self._powers.learns.between_steps()
        return touched

    def idle_work(self) -> bool:
        """Nothing to serve: let the drafter use the time (a learner trains one
        micro-batch). Returns whether it did anything; a server's loop asks while idle."""
        if self.has_work or self._powers.learns is None:
            return False
        return self._powers.learns.between_steps(idle=True)

    def _admission(self, caller_time: bool) -> Generator[None, None, list[LiveSequence]]:
        """Move waiting requests (FIFO) into free rows and prefill them. A request that
        needs a longer cache than the current one waits until the engine is idle, when the
        cache is rebuilt to fit it. Yields between prefill passes; the time until it is
        resumed counts in no prefill time (decode steps may run there), and with
        `caller_time` in no request's clock either."""
        if not self.waiting:
            return []
        started = time.perf_counter()
        if not self.live:
            self._ensure_cache()
        admitted: list[LiveSequence] = []
        while self.waiting and len(self.live) + len(admitted) < self._cache.max_batch:
            seq = self.waiting[0]
            if len(seq.prompt_ids) + seq.params.max_tokens + self.headroom > self._cache.max_len:
                break
            admitted.append(self.waiting.popleft())
        if not admitted:
            return []
        first_row = len(self.live)
        fresh = not first_row  # the batch starts with this prefill
        prefill_started = time.perf_counter()
        passes, away = self._prefill_passes(admitted, first_row), 0.0
        while True:
            try:
                next(passes)
            except StopIteration as done:
                tokens, states = done.value
                break
            paused = time.perf_counter()
            try:
                yield
            except BaseException:  # abandoned between passes: free the rows now
                passes.close()
                raise
            waited = time.perf_counter() - paused
            away += waited  # not the prefill's time either way
            if caller_time:
                postpone(admitted + self.live + list(self.waiting), waited)
        if len(self.live) != first_row:  # rows left in decode steps between the passes
            first_row = self._move_admitted(len(admitted), first_row)
        now = time.perf_counter()
        # The target's prefill alone (no cache allocation): a lazy draft's catch-up is
        # priced from it until one is timed. It computed the positions no stored prefix gave.
        prefilled = tuple(states.lengths.tolist())
        seconds = now - prefill_started - away
        self.window.observe(
            StepRecord(len(admitted), prefilled=prefilled, prefill_s=seconds, fresh=fresh)
        )
        for seq, token in zip(admitted, tokens.tolist(), strict=True):
            seq.append(token, self.eos_ids, now)
        self.live.extend(admitted)
        # Sequences done after one token leave before the drafter ever sees them.
        drop_finished(self.live, [self._cache], start=first_row)
        if self._drafter is not None and len(self.live) > first_row:
            self._drafter.admit([s.prompt_ids + s.output_ids for s in self.live[first_row:]])
            if self._powers.watches is not None:
                kept = [admitted.index(s) for s in self.live[first_row:]]
                self._powers.watches.observe_pass(states.select(kept, first_row))
        self.prefill_s += time.perf_counter() - started - away
        return admitted

    def _move_admitted(self, n: int, first_row: int) -> int:
        """Pack `n` rows prefilled from `first_row` right after the live rows (some left
        during the prefill's passes); returns their new first row."""
        to = len(self.live)
        for i in range(n):
            self._cache.move_row(first_row + i, to + i)
        return to

    def _ensure_cache(self) -> None:
        """(Re)build the KV cache and drafter, while idle, big enough for the queue."""
        if self.max_len is not None:
            rows, length = self.max_batch, self.max_len
        else:
            rows = min(self.max_batch, len(self.waiting))
            length = max(len(s.prompt_ids) + s.params.max_tokens for s in self.waiting)
            length += self.headroom
        cache = self._cache
        if cache is not None and cache.max_batch >= rows and cache.max_len >= length:
            return
        self._cache = self._drafter = None  # free the old memory first
        self._powers = DrafterPowers.of(None)
        self._target = self.model
        self._cache = self.model.new_cache(rows, length)
        if self.drafter_factory is not None:
            self._drafter = self.drafter_factory(rows, length)
            self._powers = DrafterPowers.of(self._drafter)
            if self.draft_prefix_cache is not None and isinstance(self._drafter, UsesPrefixCache):
                self._drafter.use_prefix_cache(self.draft_prefix_cache)
            if self._pricer is not None:  # what prices a step before it is timed
                costs = self._powers.costs
                self._pricer.price_models(self.model, None if costs is None else costs.model)
        # Fixed-shape passes keep no layer inputs: a drafter reading them gets eager passes.
        if self.static_passes and not self._powers.aux_layers:
            self._target = StaticPasses(
                self.model, self._cache, rows, self.headroom - 1, graphs=self.cuda_graphs
            )

    def _drop_finished(self) -> None:
        if self.prefix_cache is not None:  # a finished history is the next turn's prefix
            for row, seq in enumerate(self.live):
                if seq.finished:
                    history = seq.prompt_ids + seq.output_ids
                    cached = int(self._cache.lengths[row])  # all but the newest token
                    self.prefix_cache.save(self._cache, row, history[: min(cached, len(history))])
        holders = [self._cache] if self._drafter is None else [self._cache, self._drafter]
        drop_finished(self.live, holders)

    def _step(self, live: list[LiveSequence], cache: KVCache, drafter: Drafter | None) -> None:
        """Propose -> verify -> accept -> commit and roll back -> emit -> observe."""
        B = len(live)
        params = [s.params for s in live]
        generators = [s.generator for s in live]
        left = [tokens_left(s) for s in live]  # [B]
        # A row's own window: never verify drafts past its max_tokens, none if it opted out.
        cap = torch.tensor([r - 1 if p.speculate else 0 for p, r in zip(params, left, strict=True)])
        k = self._choose(B, max(left), cap, drafter)
        timer = _StepTimer()
        draft = self._propose(k, cap, live, generators, drafter)
        caught_up, catch_up_s = self._last_catch_up()
        draft_s = timer.lap() - catch_up_s
        device = self.model.device
        if isinstance(draft, TreeDraft):
            verify, acceptor = verify_tree, self.tree_acceptor
        else:
            verify, acceptor = verify_chain, self.acceptor
        aux = self._powers.aux_layers  # the layer inputs the drafter reads (EAGLE-3)
        verdict, states = verify(
            self._target, acceptor, live, cache, draft, params, generators, device, aux_layers=aux
        )
        accepted = verdict.num_accepted.cpu()  # [B]
        if drafter is not None:
            next_tokens = verdict.tokens.gather(1, verdict.num_accepted[:, None])[:, 0]
            drafter.commit(verdict.num_accepted, next_tokens)
            if self._powers.watches is not None:  # not in Algorithm 1: the target's states
                self._powers.watches.observe_pass(states)
        emitted = verdict.tokens.tolist()  # the one host sync of the step
        verify_s = timer.lap()
        self._emit(live, emitted, accepted.tolist(), draft.lengths.tolist(), timer.now)
        tree = isinstance(draft, TreeDraft)
        costs = self._powers.costs
        self.window.observe(
            StepRecord(
                B,
                k,
                width=1 + (k if tree else draft.k),
                drafted=tuple((draft.lengths if tree else torch.clamp(cap, max=k)).tolist()),
                accepted=tuple(accepted.tolist()),
                left=tuple(left),
                left_after=tuple(0 if s.finished else tokens_left(s) for s in live),
                whole_batch=self._one_job and not self.waiting,
                draft_s=draft_s,
                first_s=costs.last_first_s if k and costs is not None else None,
                verify_s=verify_s,
                catch_up_tokens=caught_up,
                catch_up_s=catch_up_s,
            )
        )

    def _choose(self, rows: int, remaining: int, cap: torch.Tensor, drafter) -> int:
        """The window's k; a plain step, the window's plan untouched, where no row can draft."""
        if drafter is not None and not cap.any():
            k = 0
        else:
            catching_up = self._powers.catches_up
            catch_up = 0 if catching_up is None else catching_up.catch_up_tokens()
            k = self.window.choose(Batch(rows, remaining, catch_up))
        self.last_window = k
        return k

    def _last_catch_up(self) -> tuple[int, float]:
        """(tokens, seconds) of the catch-up pass inside the latest proposal, if any."""
        catching_up = self._powers.catches_up
        return (0, 0.0) if catching_up is None else catching_up.last_catch_up

    def _propose(self, k, cap, live, generators, drafter) -> Draft | TreeDraft:
        """The drafter's proposal (at k = 0 it may keep its state in step), each row's cut
        to its cap and the chain to its longest row."""
        B, device = len(live), self.model.device
        if drafter is None:
            return Draft.empty(B, device)
        if self._powers.processors is not None:  # penalties, logit_bias, grammars on q too
            self._powers.processors.use_processors([s.processor for s in live])
        params = [s.params for s in live]
        draft = drafter.propose(k, params, generators)  # tokens [B, k], q [B, k, V]
        if isinstance(draft, TreeDraft):
            if self.tree_acceptor is None:
                raise InvalidParameterError(
                    f"{type(self.acceptor).__name__} verifies chains only: a tree drafter "
                    "needs the rejection or greedy acceptor (or a tree_acceptor)"
                )
            draft = draft.truncated(cap)
            if int(draft.num_nodes.max()) > max(self.max_tree_nodes, k):
                raise InvalidParameterError(
                    f"the drafter proposed a tree of {int(draft.num_nodes.max())} nodes: "
                    "give the Engine max_tree_nodes=drafter.max_nodes to reserve room"
                )
            return draft
        # tokens and q on the target's device (a model-free drafter works on the host),
        # lengths on the host, as the acceptors expect
        return _trimmed(
            replace(
                draft,
                tokens=draft.tokens.to(device),
                probs=None if draft.probs is None else draft.probs.to(device),
                lengths=torch.minimum(draft.lengths.cpu(), cap),
            )
        )

    def _emit(self, live, emitted, accepted, drafted, now: float) -> None:
        """Each row's kept drafts and its own token, up to its end (EOS, a stop string)."""
        for seq, row, n, width in zip(live, emitted, accepted, drafted, strict=True):
            before = len(seq.output_ids)
            for token in row[: n + 1]:
                seq.append(token, self.eos_ids, now)
                if seq.finished:
                    break
            out = len(seq.output_ids) - before
            # Draft tokens past the end were accepted but never kept.
            seq.stats.record_step(width, min(n, out))
            seq.trace.append((width, min(n, out), out))

    def _prefill_passes(
        self, seqs: list[LiveSequence], first_row: int
    ) -> Generator[None, None, tuple[torch.Tensor, PassStates]]:
        """`prefill.prefill_passes` of the admitted rows into this engine's cache."""
        return prefill_passes(
            self.model,
            self._cache,
            seqs,
            first_row,
            self.acceptor,
            self.prefill_chunk,
            self.prefix_cache,
            self._powers.aux_layers,
        )

    def completion(self, seq: LiveSequence) -> Completion:
        """The result of a finished (or aborted) request; times count from its arrival."""
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        stats = seq.stats
        stats.generated = len(seq.output_ids)
        stats.elapsed_s = (seq.finished_at or time.perf_counter()) - seq.arrived_at
        stats.ttft_s = (seq.first_token_at or seq.arrived_at) - seq.arrived_at
        return Completion(
            text=seq.stop.cut(text),
            token_ids=seq.output_ids,
            prompt_tokens=len(seq.prompt_ids),
            finish_reason=seq.finish_reason or "length",
            stats=stats,
            logprobs=seq.logprobs,
        )


_T = TypeVar("_T")


def _drained(steps: Generator[None, None, _T]) -> _T:
    """Run a generator of steps to its end and return its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _trimmed(draft: Draft) -> Draft:
    """The draft cut to its longest row: a verify pass is as wide as its widest row, and
    a drafter that proposes less than the window (a prompt lookup that found no match
    for any row) should not pay for positions nobody drafted. With no row drafting, the
    step costs a plain step."""
    longest = int(draft.lengths.max()) if draft.lengths.numel() else 0
    if longest >= draft.k:
        return draft
    return replace(
        draft,
        tokens=draft.tokens[:, :longest],
        probs=None if draft.probs is None else draft.probs[:, :longest],
    )


class _StepTimer:
    """Wall seconds of a step's phases, less the one-off graph captures inside them."""

    def __init__(self) -> None:
        self.now, self._captured = time.perf_counter(), capture_seconds()

    def lap(self) -> float:
        now, captured = time.perf_counter(), capture_seconds()
        seconds = now - self.now - (captured - self._captured)
        self.now, self._captured = now, captured
        return seconds
