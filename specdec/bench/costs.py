"""Measured costs the predictions are built from: the draft step c and the verify curve v(k).

Measured once per (batch size, context length), outside the engine, on the loaded models:
a verify pass of k+1 tokens per row after `context` committed tokens, and one draft token
per row, each with the work a step does around the forward pass (probabilities over the
vocabulary at every position, the acceptor, sampling the draft token, the host sync):
`--speculate auto` times whole steps, and on a small model or one CPU thread that work is
a sizeable part of a step (~25 ms at k = 4 over Qwen's 152k-token vocabulary).

The context is committed without computing it (the cache's lengths are advanced
over zeros): attention reads the same number of bytes whatever the values, so the cost is
the same and a 16 x 1024-token prefill is not paid twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specdec.acceptors import Draft, RejectionSampler
from specdec.graphs.static_pass import StaticPasses, use_static_passes
from specdec.heads.eagle import EagleHead
from specdec.heads.eagle3 import Eagle3Head
from specdec.params import SamplingParams
from specdec.sampling import make_generator, param_tensors, probs_from_logits, request_probs, sample
from specdec.window import CostModel

WARMUP = 2  # unmeasured passes first: the first calls of a shape are slower


def forward_seconds(
    model,
    rows: int,
    widths: tuple[int, ...],
    context: int,
    repeats: int = 3,
    work: Callable[[torch.Tensor], None] | None = None,
    clock: Callable[[], float] | None = None,
    static_passes: bool = False,
    cuda_graphs: bool = False,
) -> dict[int, float]:
    """{T: seconds of one pass of T tokens on each of `rows` rows after `context`
    committed positions} for every T in `widths` (logits at every position, as a verify
    pass computes): the fastest of `repeats` for each, since a neighbour on a shared
    machine only ever adds time. The widths take turns within each repeat, so a
    neighbour's busy spell slows them alike instead of one width's whole series (timed
    one width after the other, a plain step measured under load made wider passes look
    cheaper than a plain step). `work(logits)` runs inside the timing: what a step does
    with the logits. `clock`: `cost_clock(model)` unless given. `static_passes` times the
    engine's fixed-shape passes (`cuda_graphs`: replayed graphs, captured in the warm-up),
    as an engine with those options runs them."""
    cache = model.new_cache(rows, context + max(widths) + 1)
    forward = model
    static, graphs = use_static_passes(model.device, static_passes, cuda_graphs)
    if static:
        forward = StaticPasses(model, cache, rows, max(widths), graphs=graphs)
    cache.advance(torch.full((rows,), context, dtype=torch.long), slice(0, rows))
    start = cache.lengths[:rows].clone()
    vocab_limit = min(1000, model.config.vocab_size)
    clock = clock or cost_clock(model)
    times: dict[int, list[float]] = {t: [] for t in widths}
    with torch.inference_mode():
        for i in range(WARMUP + repeats):
            # Seeded: the ranks of a tensor-parallel model must all feed the same tokens.
            seeded = torch.Generator().manual_seed(i)
            for tokens_per_row in widths:
                tokens = torch.randint(0, vocab_limit, (rows, tokens_per_row), generator=seeded)
                tokens = tokens.to(model.device)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = clock()
                logits = forward(tokens, cache).logits  # [rows, tokens_per_row, V]
                if work is not None:
                    work(logits)
                logits[:, -1, 0].tolist()  # the host sync of a real step
                if i >= WARMUP:
                    times[tokens_per_row].append(clock() - t0)
                cache.truncate(start)
    return {t: min(ts) for t, ts in times.items()}


def stacks_in_turn(
    model, stacks: dict[str, object], widths: tuple[int, ...], context: int, repeats: int
) -> dict[str, dict[int, list[float]]]:
    """{name: {T: ms of each repeat}}: `forward_seconds` at batch 1 for each of `stacks`
    (decode stacks to put in `model.decode_stack`; None runs the eager layers), taking
    turns within each repeat so a neighbour's busy spell slows them alike. The model's
    own stack is back in place afterwards."""
    own = model.decode_stack
    runs = {name: {t: [] for t in widths} for name in stacks}
    try:
        for _ in range(repeats):
            for name, stack in stacks.items():
                model.decode_stack = stack
                seconds = forward_seconds(model, 1, widths, context)
                for t in widths:
                    runs[name][t].append(seconds[t] * 1e3)
    finally:
        model.decode_stack = own
    return runs


def cost_clock(model) -> Callable[[], float]:
    """CPU time on one CPU thread (the work done, whatever share of the cores neighbours
    take: on a shared machine wall time moved single passes several-fold), wall time
    otherwise (CPU time would add up threads, or miss a GPU's work, or, for a
    tensor-parallel shard, the time a rank waits on the others' collectives)."""
    sharded = getattr(model, "tp_group", None) is not None
    if model.device.type == "cpu" and torch.get_num_threads() == 1 and not sharded:
        return time.process_time
    return time.perf_counter


def _verify_work(rows: int, device) -> Callable[[torch.Tensor], None]:
    """Target probabilities at every position and the rejection sampler over a k-token
    draft (temperature 1: the general path; greedy requests take a cheaper one)."""
    params = [SamplingParams(temperature=1.0)] * rows
    generators = [make_generator(i, device) for i in range(rows)]
    acceptor = RejectionSampler()

    def work(logits: torch.Tensor) -> None:
        B, T, _ = logits.shape
        probs = request_probs(logits, params)  # [B, T, V]
        k = T - 1
        tokens = probs[:, :k].argmax(-1)  # [B, k]: any draft; q = p makes it all accepted
        lengths = torch.full((B,), k, dtype=torch.long)
        acceptor(Draft(tokens, probs[:, :k], lengths), probs, generators).tokens.tolist()

    return work


def _draft_work(rows: int, device) -> Callable[[torch.Tensor], None]:
    """The draft distribution q of the newest position and one sampled token per row."""
    params = [SamplingParams(temperature=1.0)] * rows
    generators = [make_generator(i, device) for i in range(rows)]

    def work(logits: torch.Tensor) -> None:
        q = probs_from_logits(logits[:, -1], *param_tensors(params, logits.device))
        sample(q, generators, [False] * rows)

    return work


def measure_costs(
    target,
    draft,
    rows: int,
    context: int,
    ks: tuple[int, ...],
    repeats: int = 5,
    heads=None,
    static_passes: bool = False,
    cuda_graphs: bool = False,
) -> dict:
    """{"verify_s": {k: s}, "draft_step_s", "c", "v": {k: verify(k) / verify(0)}}, keys as
    strings so the dict survives JSON. `draft` None: a free drafter (c = 0). With
    speculator `heads`, also their cost per drafted token ("heads_step_s", "heads_c").
    `static_passes` / `cuda_graphs`: time the passes the engine runs with those options."""
    passes = {"static_passes": static_passes, "cuda_graphs": cuda_graphs}
    ks = tuple(sorted(set(ks) | {0}))
    clock = cost_clock(target)  # the draft's too: c is a ratio of the two
    vwork = _verify_work(rows, target.device)
    widths = forward_seconds(
        target, rows, tuple(k + 1 for k in ks), context, repeats, vwork, clock, **passes
    )
    verify = {k: widths[k + 1] for k in ks}
    draft_s = 0.0
    if draft is not None:
        dwork = _draft_work(rows, draft.device)
        draft_s = forward_seconds(draft, rows, (1,), context, repeats, dwork, clock, **passes)[1]
    return {
        "rows": rows,
        "context": context,
        "clock": "cpu" if clock is time.process_time else "wall",
        "verify_s": {str(k): round(s, 6) for k, s in verify.items()},
        "draft_step_s": round(draft_s, 6),
        "c": round(draft_s / verify[0], 4),
        "v": {str(k): round(s / verify[0], 4) for k, s in verify.items()},
    } | _heads_entry(heads, rows, repeats, verify[0], clock)


def _heads_entry(heads, rows: int, repeats: int, target_s: float, clock) -> dict:
    if heads is None:
        return {}
    eagle = isinstance(heads, EagleHead | Eagle3Head)
    timed = eagle_step_seconds if eagle else heads_step_seconds
    step = timed(heads, rows, clock, repeats)
    return {"heads_step_s": round(step, 6), "heads_c": round(step / target_s, 4)}


def heads_step_seconds(
    speculator, rows: int, clock: Callable[[], float], repeats: int = 5
) -> float:
    """Seconds per drafted token of trained speculator heads at `rows` rows on `clock`
    (the target's, so the ratio is like for like): one greedy chain of all n heads (what a
    step of `heads-kN` runs), over n; the fastest of `repeats`. The heads read a hidden
    state and a token, so random ones cost the same."""
    n = speculator.config.n_predict
    weight = speculator.proj[0].weight
    hidden = torch.randn(rows, speculator.config.emb_dim, dtype=weight.dtype, device=weight.device)
    last = torch.zeros(rows, dtype=torch.long, device=weight.device)
    times = []
    for i in range(WARMUP + repeats):
        t0 = clock()
        speculator.propose_greedy(hidden, last, n).tolist()  # the host sync of a real step
        if i >= WARMUP:
            times.append(clock() - t0)
    return min(times) / n


def eagle_step_seconds(
    head: EagleHead | Eagle3Head,
    rows: int,
    clock: Callable[[], float],
    repeats: int = 5,
    context: int = 256,
) -> float:
    """Seconds per drafted token of an eagle or EAGLE-3 head at `rows` rows on `clock`: a
    step of `heads-kN` (its newest true entry, then n - 1 fed-back ones, over a
    `context`-entry cache), over n; the fastest of `repeats`. Random states cost what real
    ones do."""
    from specdec.drafters.base import PassStates
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.eagle3 import Eagle3Drafter

    n, c = head.config.n_predict, head.config
    weight = head.fc.weight
    three = isinstance(head, Eagle3Head)  # it reads three layers' inputs
    drafter = (Eagle3Drafter if three else EagleDrafter)(
        head, rows, context + repeats + WARMUP + n + 2
    )
    drafter.admit([[0] * (context + 1)] * rows)  # a prompt of `context` and its first token

    def observe(T: int) -> None:
        def states(width: int) -> torch.Tensor:
            return torch.randn(rows, T, width, dtype=weight.dtype, device=weight.device)

        tokens = torch.zeros(rows, T, dtype=torch.long, device=weight.device)
        aux = states(head.feature_size) if three else None
        drafter.observe_pass(
            PassStates(tokens, states(c.hidden_size), torch.full((rows,), T), aux=aux)
        )

    observe(context)
    drafter.propose(1, [], [])  # the catch-up, not timed
    times = []
    for i in range(WARMUP + repeats):
        drafter.commit(torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long))
        observe(1)
        t0 = clock()
        drafter.propose(n, [], []).tokens.tolist()  # the host sync of a real step
        if i >= WARMUP:
            times.append(clock() - t0)
    return min(times) / n


def cost_model(entry: dict, drafter: str = "draft") -> CostModel | None:
    """The measured entry as the CostModel `--speculate auto` plans with, for the drafter
    kind: "draft" (the draft model's step), "ngram" (a lookup, free), "heads" (speculator
    heads; None when the entry has no heads cost)."""
    curve = {int(k): s for k, s in entry["verify_s"].items()}
    draft_s = {"ngram": 0.0, "suffix": 0.0, "heads": entry.get("heads_step_s")}.get(
        drafter, entry["draft_step_s"]
    )
    return None if draft_s is None else CostModel.measured(entry["rows"], curve, draft_s)
