"""Every decoder layer of a small int4 or bf16 step in one native call (native/decode_stack.cpp).

Why: once the int4 kernel streams the weights at the memory's speed, what is left of a
decode step on a CPU is PyTorch's per-op cost: ~40 ops per layer (norms, RoPE, cache writes,
attention, activations), each a few microseconds of dispatch and allocation, for a few rows
of arithmetic. A 0.5B draft has 24 layers: measured on a Zen 3, its int4 step took 46 ms
eagerly, ~13 of them in the products. The native stack does the same computation with the
same roundings (see the .cpp) and nothing else, and it is batch-invariant, so a verify pass
scores each token exactly as a one-token step does.

When it runs: the model is on the CPU, every projection of every layer is a
`quant.Int4Linear` (or every one a bf16 `linear.Linear` in a bf16 model), the native build
is available, and for the step's bucket of rows the stack was timed faster than the eager
layers on this machine (`tune_stack`: whole passes, both ways). Without that timing, where
the layers' own plan runs the step through the native kernel (`q4_native` or
`native_bf16`; without a plan, int4 steps of up to `PACKED_MAX_ROWS` rows). That takes in
prefills too where the plan gives a prefill's rows to the native kernel (the int4 1.5B on a
Zen 3: its products run in row blocks, its attention skips the keys a causal mask hides);
everything else takes the eager layers. A bf16 stack in the batch-invariant mode (the
default, `kernels.invariance`) takes every pass, prefills included, untimed: its result
for a row does not depend on the rows beside it, where the eager layers' does.
`SPECDEC_FUSED=0` turns it off (for comparisons; bf16 passes are then not invariant).

Why whole passes: each projection's plan is the kernel fastest for that projection alone,
which leaves out the ~40 ops per layer the stack saves. On the 2-core EPYC the oneDNN
kernel led the bf16 gate/up projections of SmolLM2 and the Qwen 1.5B, so their steps ran
eagerly: 27 ms a SmolLM2 step where the stack takes 16, 124-132 ms a 1.5B step where it
takes 111. At 8 rows the 1.5B's eager layers win (149 ms against 180-190).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import torch

from specdec.kernels import invariance, kernel_plans, native, tuning, tuning_budget
from specdec.kernels.linear import STACK_BUCKETS, Linear, bucket_of
from specdec.kernels.quant import PACKED_MAX_ROWS, Int4Linear, _q4_bias

if TYPE_CHECKING:  # annotations only: the models are built on these kernels
    from specdec.models.kv_cache import KVCache
    from specdec.models.transformer import Transformer


class DecodeStack:
    """The native stack over a `Transformer`'s layers (it keeps references to the layers'
    int4 buffers or bf16 weights; the norms are copied)."""

    def __init__(self, model: Transformer, native_stack) -> None:
        cfg = model.config
        self.probe = model.layers[0].mlp.gate_up_proj  # whose plan decides (all layers agree)
        self._kernel = "q4_native" if type(self.probe) is Int4Linear else "native_bf16"
        # bucket -> whether the stack was timed faster than the eager layers (`tune_stack`)
        self.measured: dict[int, bool] = {}
        self.forced: bool | None = None  # while `tune_stack` times one way
        # bf16 in the batch-invariant mode (`kernels.invariance`): every pass runs here,
        # whatever its rows, so no row's result depends on the rows beside it
        self.invariant = self._kernel == "native_bf16" and invariance.enabled()
        self._stack = native_stack(
            [_layer_tensors(layer) for layer in model.layers],
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
        )

    @classmethod
    def for_model(cls, model: Transformer) -> DecodeStack | None:
        """The stack for `model`, or None where it does not apply (see the module doc)."""
        if os.environ.get("SPECDEC_FUSED", "1") == "0" or not _applies(model):
            return None
        built = native.decode_stack()
        return None if built is None else cls(model, built)

    def takes(self, rows: int) -> bool:
        """Whether a step of `rows` new tokens in all should run here."""
        if self.forced is not None:
            return self.forced
        if self.invariant:
            return True
        bucket = bucket_of(rows)
        if bucket in self.measured:
            return self.measured[bucket]
        plan = self.probe.plan
        if not plan:  # untuned: int4 steps the int4 kernel serves well; bf16 ones stay eager
            return self._kernel == "q4_native" and rows <= PACKED_MAX_ROWS
        return plan.get(bucket_of(rows)) == self._kernel

    def run(
        self,
        x: torch.Tensor,  # [B, T, H] embedded tokens
        cache: KVCache,
        rows: slice,
        cos: torch.Tensor,  # [B, T, 1, D]
        sin: torch.Tensor,
        slots: torch.Tensor,  # [B, T] cache slot of each token
        span: int,
        mask: torch.Tensor | None,  # [B, 1, T, span] bool
        keep: tuple[int, ...] = (),  # layers whose inputs are handed back too
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[B, T, H]` after the last layer (before the final norm), and the inputs of the
        layers `keep` side by side `[B, T, len(keep) * H]` (None where `keep` is empty)."""
        return self._stack.run(
            x, cache.k, cache.v, rows.start, slots, cos, sin, span, mask, list(keep)
        )


def _projections(layer) -> tuple:
    return (
        layer.self_attn.qkv_proj,
        layer.self_attn.o_proj,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
    )


def _applies(model: Transformer) -> bool:
    cfg = model.config
    projections = [p for layer in model.layers for p in _projections(layer)]
    int4 = all(type(p) is Int4Linear for p in projections)
    bf16 = model.dtype == torch.bfloat16 and all(_native_bf16(p) for p in projections)
    return (
        model.device.type == "cpu"
        and model.dtype in (torch.float32, torch.bfloat16)
        and cfg.head_dim % 8 == 0
        and cfg.head_dim <= 512
        and (int4 or bf16)
    )


def _native_bf16(p) -> bool:
    """A plain bf16 `Linear` (not a tensor-parallel shard) the native bf16 kernel takes."""
    return type(p) is Linear and "native_bf16" in p.kernels()


def _layer_tensors(layer) -> list[torch.Tensor]:
    """The 30 tensors of a layer in decode_stack.cpp's order: the two norms, then qkv, o,
    gate_up and down as (qs, sc, mn, d, dmin, fp32 bias or an empty tensor, the tile layout
    or an empty tensor), bf16 ones as (weight, four empty tensors, fp32 bias or an empty
    tensor, the panel layout `native_bf16` reads or an empty tensor)."""
    norms = layer.input_layernorm, layer.post_attention_layernorm
    tensors = [norm.weight.detach() for norm in norms]
    for p in _projections(layer):
        if type(p) is Int4Linear:
            bias = _q4_bias(p)  # the fp32 bias the int4 kernel adds, as the eager layer does
            tensors += [*p.q4.tensors(), _or_empty(bias), p.tiles]
        else:  # bf16: the eager native_bf16 kernel adds the bias in fp32 too
            bias = torch.empty(0) if p.bias is None else p.bias.detach().float()
            p.prepare("native_bf16")  # the panel layout where the build reads it
            panels = p.formats.get("native_bf16")
            tensors += [p.weight.detach(), *[torch.empty(0)] * 4, bias, _or_empty(panels)]
    return tensors


def _or_empty(t: torch.Tensor | None) -> torch.Tensor:
    return torch.empty(0) if t is None else t


# Buckets the stack competes for: a decode step, a verify pass, a few rows of either.
# Longer passes (prefills) are the eager layers' (their products are compute-bound).
CONTEXT = 64  # committed positions before the timed passes (a short prompt)
REPEATS = 3


def stack_key(model: Transformer) -> str:
    """What decides whether the stack beats the eager layers: the layer count, the
    attention's shape and the projections' groups (their kind, shape, dtype, bias and
    int4 layout)."""
    cfg = model.config
    groups = ", ".join(tuning.group_key(p) for p in _projections(model.layers[0]))
    heads = f"{cfg.num_heads}/{cfg.num_kv_heads} heads x {cfg.head_dim}"
    return f"{cfg.num_layers} layers, {heads}: {groups}"


def tune_stack(model: Transformer, *, cache=None, retune: bool = False) -> dict | None:
    """Time `model`'s passes through its stack and through its eager layers (after
    `tune_kernels`, with the projections' plans), per bucket of rows, and let the stack
    take the buckets where it was faster. Stored beside the kernel plans, keyed by the
    machine and `stack_key`, so a process on the same machine reads the choice. Returns
    the entry (None where the model has no stack).

    Without a measurement and without tuning budget left (`tuning_budget`), the stack
    takes the buckets `kernel_plans` predicts for this CPU (stored as predicted, measured
    by a later load's budget)."""
    stack = model.decode_stack
    if stack is None:
        return None
    if stack.invariant:  # every pass runs in the stack: nothing to choose
        return {"plan": {str(b): "stack" for b in STACK_BUCKETS}, "invariant": True}
    cache = cache or tuning.kernel_cache()
    key = stack_key(model)
    stored = {} if retune else tuning.stored_entries("stacks", cache=cache)
    entry = stored.get(key)
    panels = tuning.panels_timed(stack.probe)  # a bf16 stack reads that layout
    if _stack_pending(entry, panels):
        if tuning_budget.allows():
            with tuning_budget.measuring("whole passes through the native decode stack"):
                entry = {**_measure(model, stack), "panels": panels}
        else:
            tuning_budget.skipped()
            if entry is None or not entry.get("predicted") or entry.get("panels") != panels:
                kind = "int4" if stack._kernel == "q4_native" else "bf16"
                plan = kernel_plans.predicted_stack(kind)
                entry = {"plan": plan, "predicted": True, "panels": panels}
        stored[key] = entry
        tuning.store(cache, "stacks", stored)
    stack.measured = {int(b): way == "stack" for b, way in entry["plan"].items()}
    return entry


def _stack_pending(entry: dict | None, panels) -> bool:
    return (
        entry is None
        or bool(entry.get("predicted"))
        or set(entry["plan"]) != {str(b) for b in STACK_BUCKETS}
        or entry.get("panels") != panels
    )


def pending(model: Transformer, *, cache=None) -> int:
    """1 where `model`'s stack has not been measured here yet (`tune_stack` would time it)."""
    stack = model.decode_stack
    if stack is None or stack.invariant:
        return 0
    entry = tuning.stored_entries("stacks", cache=cache).get(stack_key(model))
    return int(_stack_pending(entry, tuning.panels_timed(stack.probe)))


def _measure(model: Transformer, stack: DecodeStack) -> dict:
    """{"plan": {bucket: "stack" | "eager"}, "seconds": {rows: {way: s}}}: each bucket
    timed at its fewest and its most rows (as the kernel plans are), the two ways taking
    turns so a neighbour's busy spell slows both alike; the fastest of `REPEATS`."""
    ends = {b: sorted({tuning.lowest_rows(b), b}) for b in STACK_BUCKETS}
    widths = sorted({r for rs in ends.values() for r in rs})
    cache = model.new_cache(1, CONTEXT + max(widths) + 1)
    cache.advance(torch.full((1,), CONTEXT, dtype=torch.long), slice(0, 1))
    start = cache.lengths[:1].clone()
    tokens = torch.randint(0, min(1000, model.config.vocab_size), (1, max(widths)))
    seconds: dict[int, dict[str, list[float]]] = {t: {"stack": [], "eager": []} for t in widths}
    try:
        with torch.inference_mode():
            for repeat in range(1 + REPEATS):  # the first round warms up
                for t in widths:
                    for way in ("stack", "eager"):
                        stack.forced = way == "stack"
                        t0 = time.perf_counter()
                        model(tokens[:, :t].to(model.device), cache)
                        if repeat:
                            seconds[t][way].append(time.perf_counter() - t0)
                        cache.truncate(start)
    finally:
        stack.forced = None
    best = {t: {way: min(s) for way, s in ways.items()} for t, ways in seconds.items()}

    def total(bucket: int, way: str) -> float:
        return sum(best[t][way] for t in ends[bucket])

    return {
        "plan": {
            str(b): "stack" if total(b, "stack") < total(b, "eager") else "eager"
            for b in STACK_BUCKETS
        },
        "seconds": {str(t): {w: round(s, 6) for w, s in ways.items()} for t, ways in best.items()},
    }
