"""Fixed-shape decode and verify passes: preallocated inputs, buckets, CUDA graphs.

Why: on a GPU the eager pass is host-bound (~1100 kernel launches, 3.3 ms of kernels in
35.8 ms of wall time: "On a GPU" in the archived docs/BENCHMARKS.md, git tag
commit 1f7ab6a). A CUDA graph replays a captured pass with one launch, but only over the
shapes and memory addresses it was captured with. So:

- a call's (rows, tokens per row) is padded up to a **bucket** (`Bucket`, `pick`); the
  keys attended are the cache positions `[0, span)` with `span` bucketed too (cost grows
  with the context, not with the cache's `max_len`);
- every input that changes between steps (token ids, RoPE positions, cache write slots,
  committed lengths, new-token counts, the tree's visibility, logit positions) lives in
  one preallocated tensor per bucket, updated in place with `copy_` (`PassBuffers`);
- the attention mask, RoPE tables and write indices are computed *inside* the pass from
  those buffers (`static_mask`), so nothing in it depends on a value read on the host.

Padding is inert: padding tokens (t >= num_new of a row) and padding rows (the cache's
free rows past the batch, whose `num_new` is 0) write their keys/values to the cache's
scratch slot, which no query attends (spans stop short of it), and a padding query attends
to key 0 only, so it never makes a NaN that could reach the cache.

`StaticPasses` is called like `Transformer.forward` for batches starting at cache row 0
(decode, verify, tree verify, a draft model's step); prefills stay eager. On CUDA (with
`graphs=True`) each bucket is captured once, lazily, on its first call (warm-up on a side
stream, then `torch.cuda.CUDAGraph` capture into one shared memory pool) and replayed
after; elsewhere the same buffers run the same pass eagerly, which is what CPU tests check.

`StaticHeads` does the same for speculator heads' drafting (`MLPSpeculator.propose_*`),
which reads the drafter's own preallocated `hidden [B, E]` / `last [B]` rows in place.

Outputs are views of the pass's tensors, valid until the next call of the same object
(with graphs, the span buckets of one (rows, tokens) write the same output tensors);
`hidden` is cloned because drafters may keep it.
"""

from __future__ import annotations

import functools
import gc
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

from specdec.graphs.fused_layers import fused_layers_apply, run_fused_layers
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import ForwardOutput, Transformer

WARMUP_RUNS = 2  # eager runs on a side stream before capture (allocator, cuBLAS workspaces)
CHOICE_REPLAYS = 10  # replays per timing when two layer stacks compete for a bucket
CHOICE_ROUNDS = 3  # alternating rounds of them (each stack's median round is its time)
MIN_SPAN = 256  # the smallest key span bucket: below it attention is a rounding error
_captured_s = 0.0  # seconds this process spent warming up and capturing graphs
EFFICIENT_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION]  # a list: sdpa_kernel refuses tuples


def eager_layers(model: Transformer, *args) -> torch.Tensor:
    """`Transformer.run_layers`' final states alone: a fixed-shape pass hands over no layer
    inputs (an EAGLE-3 drafter runs with the eager passes)."""
    return model.run_layers(*args)[0]


def capture_seconds() -> float:
    """Seconds spent so far (in this process) warming up and capturing CUDA graphs. A
    bucket is captured inside the step that first needs it; the engine takes the
    difference out of that step's timings, so `auto` prices replays, not captures."""
    return _captured_s


def bucket_sizes(limit: int, smallest: int = 1) -> tuple[int, ...]:
    """Powers of two from `smallest` below `limit`, then `limit` itself: (1, 2, 4, 6) for 6.
    A padded call wastes less than half its work; the last bucket is exactly the limit,
    so nothing larger than the cache's rows (or length) is ever needed."""
    sizes, size = [], smallest
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


def pick(sizes: tuple[int, ...], n: int) -> int:
    """The smallest bucket holding `n`."""
    for size in sizes:
        if n <= size:
            return size
    raise ValueError(f"{n} exceeds the largest bucket ({sizes[-1]})")


def use_static_passes(
    device: torch.device, static_passes: bool | None, cuda_graphs: bool | None
) -> tuple[bool, bool]:
    """(static passes, CUDA graphs) for a model on `device`: both on by default on CUDA,
    off on the CPU (where `cuda_graphs` is ignored and the eager pass stays as it was);
    `static_passes=True` alone runs the buffered passes eagerly (the CPU tests' way),
    `cuda_graphs=False` is the eager fallback (`--no-cuda-graphs`)."""
    on_cuda = torch.device(device).type == "cuda"
    graphs = on_cuda and cuda_graphs is not False
    static = graphs if static_passes is None else static_passes
    return static, graphs and static


@dataclass(frozen=True)
class Bucket:
    """The fixed shape of one captured pass."""

    rows: int  # R: batch rows (cache rows 0..R-1)
    tokens: int  # T: new tokens per row
    span: int  # S: cache positions attended, [0, S)
    logits: int  # n: logit positions per row; 0 = every one of the T


class PassBuffers:
    """The inputs of one bucket's pass, preallocated on the device and updated in place.

    `fill` writes a call's values (padding everything past it); `idle` makes every row and
    token padding, which is what warm-up and capture run on (their writes go to scratch).

    What changes every step (lengths, new-token counts, write slots) lives in one packed
    buffer, so a call takes one host-to-device copy (with the token ids, two); the
    positions and visibility of a chain are the same for every call of a bucket (below),
    so they are copied only after a tree has replaced them.
    """

    def __init__(self, bucket: Bucket, device: torch.device, scratch_slot: int) -> None:
        R, T, n = bucket.rows, bucket.tokens, bucket.logits
        self.bucket, self.scratch_slot = bucket, scratch_slot
        self.tokens = torch.zeros(R, T, dtype=torch.long, device=device)  # [R, T] token ids
        self.packed = torch.zeros(R * (2 + T), dtype=torch.long, device=device)
        self.lengths = self.packed[:R]  # [R] committed tokens before the pass
        self.num_new = self.packed[R : 2 * R]  # [R] real new tokens (0 for padding rows)
        self.slots = self.packed[2 * R :].view(R, T)  # [R, T] cache slot each token writes
        # A chain's positions and visibility, whatever its rows and tokens: token t at
        # offset t, seeing tokens 0..t. Entries past a row's new tokens (or of padding
        # rows) are never read (`static_mask` keeps only real keys and queries).
        self._chain = (
            torch.arange(T).repeat(R, 1),  # [R, T]
            torch.ones(T, T, dtype=torch.bool).tril().repeat(R, 1, 1),  # [R, T, T]
        )
        self.offsets = self._chain[0].to(device, copy=True)  # [R, T] offsets from the length
        self.visible = self._chain[1].to(device, copy=True)  # [R, T, T]: t sees new token j
        self.holds_chain = True
        self.logits_at = torch.zeros(R, n, dtype=torch.long, device=device) if n else None  # [R, n]
        self.rows = torch.arange(R, device=device)[:, None]  # [R, 1] constant
        self._steps = torch.arange(T)  # [T] host constant
        self.idle()

    def idle(self) -> None:
        """Every token padding: all writes to the scratch slot."""
        self.lengths.zero_()
        self.num_new.zero_()
        self.slots.fill_(self.scratch_slot)

    def fill(
        self,
        tokens: torch.Tensor,  # [B, t] on the device
        lengths: torch.Tensor,  # [B] host
        num_new: torch.Tensor,  # [B] host
        tree: tuple[torch.Tensor, torch.Tensor] | None,  # offsets [B, t], visible [B, t, t]
        logits_at: torch.Tensor | None,  # [B, n] (any device)
    ) -> None:
        """Copy one call into the buffers, padding rows and tokens past it (padding rows
        keep length 0 and write to scratch). `tree=None` is a chain."""
        R, T = self.bucket.rows, self.bucket.tokens
        B, t = tokens.shape
        self.tokens[:B, :t].copy_(tokens)  # stale ids past t are valid ids: harmless
        host = torch.zeros(R * (2 + T), dtype=torch.long)  # the packed buffer's values
        host[:B] = lengths
        host[R : R + B] = num_new
        slots = host[2 * R :].view(R, T)  # real tokens at length + t, the rest to scratch
        torch.add(host[:R, None], self._steps, out=slots)
        slots.masked_fill_(self._steps >= host[R : 2 * R, None], self.scratch_slot)
        non_blocking = self.tokens.device.type == "cuda"
        self.packed.copy_(host, non_blocking=non_blocking)
        if tree is not None:
            offsets, visible = self._chain[0].clone(), torch.zeros(R, T, T, dtype=torch.bool)
            offsets[:B, :t], visible[:B, :t, :t] = tree
            self.offsets.copy_(offsets, non_blocking=non_blocking)
            self.visible.copy_(visible, non_blocking=non_blocking)
        elif not self.holds_chain:
            self.offsets.copy_(self._chain[0], non_blocking=non_blocking)
            self.visible.copy_(self._chain[1], non_blocking=non_blocking)
        self.holds_chain = tree is None
        if self.logits_at is not None:
            self.logits_at.zero_()
            self.logits_at[:B].copy_(logits_at)


def static_mask(
    lengths: torch.Tensor,  # [R] committed tokens
    num_new: torch.Tensor,  # [R] real new tokens
    offsets: torch.Tensor,  # [R, T] position offsets of the new tokens
    visible: torch.Tensor,  # [R, T, T] bool: new token t sees new token j
    span: int,
    window: int | None,  # the sliding window in positions (None: none)
) -> torch.Tensor:  # [R, 1, T, span] bool
    """The attention mask of a pass, on the device, from fixed-shape tensors: the committed
    prefix, plus the new tokens `visible` marks (stored at slots `lengths + j`, j < num_new);
    the sliding window counts RoPE positions. A padding query (t >= num_new) sees key 0
    only: a row with no visible key would make NaNs. `Transformer._tree_mask` is the same
    rule over a host-sized span."""
    R, T = offsets.shape
    keys = torch.arange(span, device=lengths.device)[None, :]  # [1, S]
    new = keys - lengths[:, None]  # [R, S]: index among the new tokens
    is_new = (new >= 0) & (new < num_new[:, None])
    index = new.clamp(0, T - 1)
    tree = visible.gather(2, index[:, None, :].expand(-1, T, -1)) & is_new[:, None, :]
    mask = (keys < lengths[:, None])[:, None, :] | tree  # [R, T, S]
    if window is not None:
        key_pos = torch.where(is_new, lengths[:, None] + offsets.gather(1, index), keys)
        positions = lengths[:, None] + offsets  # [R, T]
        mask &= key_pos[:, None, :] > positions[:, :, None] - window
    real = torch.arange(T, device=lengths.device)[None, :] < num_new[:, None]  # [R, T]
    mask = torch.where(real[:, :, None], mask, (keys == 0)[:, None, :])
    return mask[:, None]


class Replay:
    """`fn()` over fixed buffers: run eagerly on every call, or captured once as a CUDA
    graph (warm-up on a side stream, then capture into `pool`) and replayed."""

    def __init__(self, fn: Callable[[], object], graphs: bool, pool=None) -> None:
        self.fn, self.graph, self.outputs = fn, None, None
        if graphs:
            started = time.perf_counter()
            self._capture(fn, pool)
            global _captured_s
            _captured_s += time.perf_counter() - started

    def _capture(self, fn: Callable[[], object], pool) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # No garbage collection inside the capture: one could free an earlier engine's
        # graphs, whose destructors make CUDA calls that a capturing stream forbids, and so
        # invalidate this capture (the full tests/gpu run hit it on an H200, after six such
        # destructors). `torch.cuda.graph` collects once before it begins.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = fn()
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize()  # the capture's cost lands here, not in the next step

    @property
    def pool(self):
        return None if self.graph is None else self.graph.pool()

    def __call__(self):
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.outputs


class StaticPasses:
    """`Transformer.forward` over one `KVCache` through fixed-shape, bucketed passes.

    `max_rows` is the most rows a call takes (at most the cache's), `max_tokens` the most
    new tokens per row (a verify pass: 1 + k_max, or 1 + a tree's nodes). `graphs=True`
    (CUDA only) captures each bucket on first use; otherwise buffers run eagerly.

    `fuse` forces the layer stack: the model's own (`eager_layers`, False) or
    the compiled one of `specdec.graphs.fused_layers` (True). By default (None), with
    graphs, the model's `layer_stack` decides, and where that is None a race does: the
    first bucket captured times each candidate (the model's own, the fused, and on CUDA
    the fused with SDPA's memory-efficient attention instead of cuDNN's), keeps the
    fastest, as the CPU kernels are chosen, and records it as the model's `layer_stack`
    for every later pass. One stack per model keeps its rounding the same in every
    bucket. Without graphs the default is the model's own stack; so it is where the fused
    one cannot run (quantized layers) or fails to compile.
    """

    def __init__(
        self,
        model: Transformer,
        cache: KVCache,
        max_rows: int,
        max_tokens: int,
        graphs: bool = False,
        min_span: int = MIN_SPAN,
        fuse: bool | None = None,
    ) -> None:
        if max_rows > cache.max_batch:
            raise ValueError(f"max_rows {max_rows} exceeds the cache's {cache.max_batch} rows")
        if graphs and model.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.cache, self.graphs = model, cache, graphs
        self.row_sizes = bucket_sizes(max_rows)
        self.token_sizes = bucket_sizes(max_tokens)
        self.span_sizes = bucket_sizes(cache.max_len, min(min_span, cache.max_len))
        self._passes: dict[Bucket, tuple[PassBuffers, Replay]] = {}
        # Output tensors per (rows, tokens, logits), shared by every span bucket: a
        # verify's fp32 logits are the largest tensor of a pass (32 x 9 x 152k: 175 MB),
        # and keeping one set per captured graph would multiply that by the spans.
        self._outputs: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool = None
        wanted = (graphs and model.layer_stack != "eager") if fuse is None else fuse
        self.fuse = wanted and fused_layers_apply(model)
        self.race = fuse is None and self.fuse  # the model's stack, or a race to choose it
        self.stacks: dict[Bucket, str] = {}  # the stack each bucket runs (`_stacks`' names)
        self.race_ms: dict[str, float] = {}  # the race's replay times, ms, by stack

    def bucket(self, rows: int, tokens: int, span: int, logits: int) -> Bucket:
        """The bucket a call of `rows` x `tokens` new tokens attending `span` keys takes."""
        return Bucket(
            pick(self.row_sizes, rows),
            pick(self.token_sizes, tokens),
            pick(self.span_sizes, span),
            logits,
        )

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, T] on the device
        cache: KVCache,
        num_new: torch.Tensor | None = None,  # [B] host
        logits_at: torch.Tensor | None = None,  # [B, n]
        first_row: int = 0,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,  # [B, T], [B, T, T] host
        aux_layers: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """`Transformer.forward`'s contract (see there), for batches at cache row 0, without
        layer inputs."""
        if cache is not self.cache or first_row != 0:
            raise ValueError("static passes run on their own cache, from row 0")
        if aux_layers:
            raise ValueError("static passes hand over no layer inputs (`aux_layers`)")
        B, T = tokens.shape
        if num_new is None:
            num_new = torch.full((B,), T, dtype=torch.long)
        rows = slice(0, B)
        cache.reserve(num_new, rows)
        lengths = cache.lengths[rows].clone()  # [B] host
        span = int((lengths + num_new).max())
        n = 0 if logits_at is None else logits_at.shape[1]
        buffers, replay = self._pass(self.bucket(B, T, span, n))
        buffers.fill(tokens, lengths, num_new, tree, logits_at)
        logits, hidden = replay()
        cache.advance(num_new, rows)
        logits = logits[:B] if n else logits[:B, :T]
        return ForwardOutput(logits=logits, hidden=hidden[:B, :T].clone())

    def _pass(self, bucket: Bucket) -> tuple[PassBuffers, Replay]:
        """The bucket's buffers and pass, captured on its first call."""
        if bucket not in self._passes:
            buffers = PassBuffers(bucket, self.model.device, self.cache.scratch_slot)
            replays = {}
            for name, stack in self._stacks().items():
                try:
                    replays[name] = self._replay(buffers, stack)
                    if self.race:  # run once (idle buffers): without graphs it compiles here
                        replays[name]()
                except Exception as error:  # a compiler failure: the model's own stack runs
                    if (
                        name == "eager"
                        or not self.race
                        or isinstance(error, torch.OutOfMemoryError)
                    ):
                        raise
                    warnings.warn(f"{name} layers failed ({error!r})", stacklevel=2)
                    replays.pop(name, None)
            if not replays:  # the model's chosen stack failed on this bucket: its own runs
                # it (rounding as the model's own layers do, not as the model's other buckets)
                replays["eager"] = self._replay(buffers, eager_layers)
            name = next(iter(replays))
            if len(replays) > 1:
                self.race_ms = _replay_ms(replays)
                name = min(self.race_ms, key=self.race_ms.get)
            if self.race and self.model.layer_stack is None:
                self.model.layer_stack = name
            self._passes[bucket] = buffers, replays[name]
            self.stacks[bucket] = name
        return self._passes[bucket]

    def _replay(self, buffers: PassBuffers, run_layers: Callable) -> Replay:
        """The pass over `buffers` through the layer stack `run_layers`, captured (with
        graphs) into the passes' shared memory pool."""
        replay = Replay(lambda: self._forward(buffers, run_layers), self.graphs, self._pool)
        self._pool = self._pool or replay.pool
        return replay

    def _stacks(self) -> dict[str, Callable]:
        """The layer stacks a new bucket may run, by name: the one `fuse` forces, the one
        the model runs (`Transformer.layer_stack`), or, where that is None, the
        candidates of a race."""
        candidates = {"eager": eager_layers}
        if self.fuse:
            candidates["fused"] = run_fused_layers
            if self.model.device.type == "cuda":  # with a mask SDPA picks cuDNN's kernel
                efficient = functools.partial(run_fused_layers, attention=EFFICIENT_ATTENTION)
                candidates["fused, efficient attention"] = efficient
        if not self.race:
            name = "fused" if self.fuse else "eager"
            return {name: candidates[name]}
        chosen = self.model.layer_stack
        return candidates if chosen is None else {chosen: candidates[chosen]}

    def _forward(
        self, b: PassBuffers, run_layers: Callable | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass over the buffers: every shape fixed by the bucket, no host reads.
        `run_layers` is the layer stack (`eager_layers`' signature; None: that one).
        Returns logits `[R, n or T, V]` and hidden `[R, T, H]`."""
        run_layers = run_layers or eager_layers
        model, bucket = self.model, b.bucket
        window = model.config.sliding_window
        mask = static_mask(b.lengths, b.num_new, b.offsets, b.visible, bucket.span, window)
        cos, sin = model._rope(b.lengths[:, None] + b.offsets)  # [R, T, 1, D]
        rows = slice(0, bucket.rows)
        hidden = run_layers(
            model, b.tokens, self.cache, rows, cos, sin, (b.rows, b.slots), bucket.span, mask
        )
        logits = model.head(hidden, b.logits_at)
        if not self.graphs:
            return logits, hidden
        key = (bucket.rows, bucket.tokens, bucket.logits)
        if key not in self._outputs:  # allocated in a warm-up run: outside the graphs
            self._outputs[key] = torch.empty_like(logits), torch.empty_like(hidden)
        out_logits, out_hidden = self._outputs[key]
        out_logits.copy_(logits)
        out_hidden.copy_(hidden)
        return out_logits, out_hidden


def _replay_ms(replays: dict[str, Replay]) -> dict[str, float]:
    """Milliseconds a replay of each takes: the median of alternating rounds of
    `CHOICE_REPLAYS` replays on the device's clock (CPU: the wall clock). Replays here run
    on idle buffers, whose writes go to the scratch slot. Counted as capture time."""
    global _captured_s
    started = time.perf_counter()
    on_cuda = torch.cuda.is_available() and any(r.graph is not None for r in replays.values())
    rounds: dict[str, list[float]] = {name: [] for name in replays}
    for _ in range(CHOICE_ROUNDS):
        for name, replay in replays.items():
            replay()  # a warm replay first
            if on_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
            t0 = time.perf_counter()
            for _ in range(CHOICE_REPLAYS):
                replay()
            if on_cuda:
                end.record()
                end.synchronize()
                rounds[name].append(start.elapsed_time(end) / 1e3)
            else:
                rounds[name].append(time.perf_counter() - t0)
    _captured_s += time.perf_counter() - started
    return {
        name: sorted(times)[len(times) // 2] / CHOICE_REPLAYS * 1e3
        for name, times in rounds.items()
    }


class StaticHeads:
    """Speculator heads' drafting over the drafter's preallocated rows, bucketed by rows.

    `hidden [max_rows, E]` and `last [max_rows]` are the drafter's own state tensors,
    updated in place between steps, so a pass reads rows `[0, R)` of them directly (rows
    past the batch are stale but inert: heads treat rows independently)."""

    def __init__(
        self,
        speculator,
        hidden: torch.Tensor,
        last: torch.Tensor,
        graphs: bool = False,
    ) -> None:
        if graphs and hidden.device.type != "cuda":
            raise ValueError("CUDA graphs need the heads on a CUDA device")
        self.speculator, self.hidden, self.last, self.graphs = speculator, hidden, last, graphs
        self.row_sizes = bucket_sizes(len(last))
        self._passes: dict[tuple, Replay] = {}
        self._pool = None

    def propose_greedy(self, rows: int, n: int) -> torch.Tensor:  # [B, n]
        R = pick(self.row_sizes, rows)
        replay = self._replay(
            ("chain", R, n),
            lambda: self.speculator.propose_greedy(self.hidden[:R], self.last[:R], n),
        )
        return replay()[:rows].clone()

    def propose_tree(self, rows: int, topk: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """`[B, P, n]` paths and `[B, P]` scores, as `MLPSpeculator.propose_tree`."""
        R = pick(self.row_sizes, rows)
        replay = self._replay(
            ("tree", R, topk),
            lambda: self.speculator.propose_tree(self.hidden[:R], self.last[:R], topk),
        )
        paths, scores = replay()
        return paths[:rows].clone(), scores[:rows].clone()

    def _replay(self, key: tuple, fn: Callable[[], object]) -> Replay:
        if key not in self._passes:
            self._passes[key] = Replay(fn, self.graphs, self._pool)
            self._pool = self._pool or self._passes[key].pool
        return self._passes[key]
