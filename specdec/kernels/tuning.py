"""Choose each projection's kernel by timing it here, and remember the choice per machine.

`tune_kernels(model)` groups a model's `Linear` layers by (kind, out, in, dtype, bias): the
layers of one group share a plan. For each bucket of row counts it times every candidate
kernel as a sweep over all layers of the group — the order and footprint of a real decode
step, so weights that do not fit the caches stream from memory as they will when decoding
— and keeps the fastest. Plans are stored in `$SPECDEC_HOME/kernels/<machine>.json`, keyed
by the machine (CPU model and flags, core count, torch version, threads): a process on the
same machine reads them instead of timing, and another CPU measures its own. The timings
behind the plans are kept with them: `projection_seconds` sums them into what a pass of n
rows costs a model, which prices a cold start of speculation before any verify pass or
draft step has been timed (`window.pricing.startup_verify_time`, `CostModel.draft_share`).

Timing the candidates costs seconds per group the first time on a machine (a few sweeps per
candidate and bucket; a candidate already 3x slower than the best after one sweep is not
timed again), minutes per model on two cores. So a machine that has measured nothing starts
from the plans predicted for its CPU (`kernel_plans`), and each load measures the uncertain
choices while its time budget lasts (`tuning_budget`, `SPECDEC_TUNE_BUDGET`); a stored
entry says "predicted": true until a load has measured it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch
from torch import nn

from specdec.kernels import kernel_plans, native, tuning_budget
from specdec.kernels.linear import BUCKETS, KERNELS_VERSION, Linear, pack_panels
from specdec.kernels.quant import Int4Linear

REPEATS = 5
GIVE_UP = 3.0  # a candidate this many times slower than the best after one sweep is dropped
# A sweep times as many layers of a group as it takes to read this many weight bytes (at
# least one layer): 4x a large L3, so the weights stream from memory as when decoding,
# without sweeping all 28 layers of a big model for each candidate and bucket.
SWEEP_BYTES = 128 * 2**20


def machine() -> dict[str, str | int]:
    """What decides which kernel is fastest: the CPU, its features, cores, torch, threads,
    and the native kernels' sources (a faster native kernel must be measured again, and
    `auto`'s cached costs with it), and the version of the PyTorch-side candidates."""
    return {
        **native.build_identity(),  # the CPU, its features, cores, torch, sources, ISA
        "threads": torch.get_num_threads(),
        "kernels": KERNELS_VERSION,
    }


def machine_id() -> str:
    return hashlib.sha256(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]


def kernel_cache() -> Path:
    from specdec.paths import cache_root

    return cache_root() / "kernels" / f"{machine_id()}.json"


def group_key(layer: Linear) -> str:
    """What a kernel plan is shared by: kind, shape, dtype, bias, and for int4 layers that
    keep the native kernel's tile layout (`tune_layout`), that layout."""
    n, k = layer.weight.shape
    bias = "bias" if layer.bias is not None else "nobias"
    tiles = " tiles" if getattr(layer, "tiles", torch.empty(0)).numel() else ""
    invariant = " invariant" if layer.invariant() else ""  # one candidate: its own entry
    return f"{type(layer).__name__} {n}x{k} {str(layer.weight.dtype)[6:]} {bias}{tiles}{invariant}"


def _groups(model: nn.Module) -> dict[str, list[Linear]]:
    groups: dict[str, list[Linear]] = defaultdict(list)
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, Linear) and module.device.type == "cpu":
            if id(module) not in seen:
                seen.add(id(module))
                groups[group_key(module)].append(module)
    return groups


def _sweep(layers: list[Linear], name: str, x: torch.Tensor) -> float:
    start = time.perf_counter()
    for layer in layers:
        layer.run(name, x)
    return time.perf_counter() - start


def _time(layers: list[Linear], name: str, x: torch.Tensor, best: float) -> float:
    """Seconds of one sweep, the fastest of `REPEATS` (noise only ever adds time). The
    first sweep warms up (first touch of a prepared format); when it is already `GIVE_UP`
    times slower than `best`, one more sweep decides: a candidate slower twice running is
    dropped. (One sweep alone once dropped the native bf16 kernel on a Xeon, timed at 4
    GB/s where it streams 19: the plan, cached for the machine, kept onednn.)"""
    first = _sweep(layers, name, x)
    if first > GIVE_UP * best:
        second = _sweep(layers, name, x)
        if second > GIVE_UP * best:
            return min(first, second)
    return min(_sweep(layers, name, x) for _ in range(REPEATS))  # least disturbed


def lowest_rows(bucket: int) -> int:
    """The fewest rows a bucket's plan serves: one more than the bucket below."""
    below = [b for b in BUCKETS if b < bucket]
    return below[-1] + 1 if below else bucket


def measure_group(layers: list[Linear]) -> dict:
    """Time every candidate for every bucket; the plan and the measurements behind it.

    A bucket's plan serves every row count from `lowest_rows` to the bucket, so each
    candidate is timed at both ends and the plan takes the least sum: a kernel whose cost
    hardly grows with the rows (one that widens the weights first) can win at 16 rows and
    lose badly at 9, a k = 8 verify pass (measured on a Zen 3: the bf16 1.5B's 9-row pass
    cost 6.8 one-row steps with the 16-row choice, where two native calls cost ~2.3).
    `seconds` keeps the timings at the bucket itself (what `projection_seconds` sums),
    `seconds_low` those at its lowest row count.

    Candidates are prepared one at a time and a format that leads no bucket is dropped at
    once, so memory holds at most the leaders' formats plus the one being timed."""
    names = list(layers[0].candidates())
    size = layers[0].stored_bytes()
    layers = layers[: max(1, -(-SWEEP_BYTES // size))]

    def swept(rows: int) -> list[Linear]:
        # Past 16 rows a product is compute-bound and need not stream from memory: fewer
        # layers per sweep keep a prefill bucket's slow candidates from taking minutes.
        return layers[: max(1, len(layers) * 16 // max(rows, 16))]

    ends = {b: sorted({lowest_rows(b), b}) for b in BUCKETS}
    inputs = {
        rows: torch.randn(
            rows, layers[0].in_features, generator=torch.Generator().manual_seed(0)
        ).to(layers[0].weight.dtype)
        for rows in sorted({r for rs in ends.values() for r in rs})
    }
    times: dict[int, dict[str, float]] = {rows: {} for rows in inputs}

    def total(bucket: int, name: str) -> float:
        return sum(times[rows][name] for rows in ends[bucket])

    with torch.inference_mode():
        for name in names:
            for layer in layers:
                layer.prepare(name)
            for rows, x in inputs.items():
                group = swept(rows)  # times are per layer: groups differ in length
                best = min(times[rows].values(), default=float("inf")) * len(group)
                times[rows][name] = _time(group, name, x, best) / len(group)
            leaders = {
                min(names[: names.index(name) + 1], key=lambda n: total(b, n)) for b in BUCKETS
            }
            for layer in layers:
                layer.formats = {n: f for n, f in layer.formats.items() if n in leaders}

    def table(rows: int) -> dict[str, float]:
        return {n: round(v, 9) for n, v in times[rows].items()}

    return {
        "plan": {str(b): min(names, key=lambda n: total(b, n)) for b in BUCKETS},
        "seconds": {str(b): table(b) for b in BUCKETS},
        "seconds_low": {str(b): table(lowest_rows(b)) for b in BUCKETS},
        "layers": len(layers),  # swept per timing (fewer past 16 rows)
        "bytes": size,  # weight bytes of one layer: GB/s = bytes / seconds (per layer)
        "panels": panels_timed(layers[0]),
    }


def panels_timed(layer: Linear) -> list[int] | None:
    """The bf16 panel layout `layer`'s native kernel runs in now (what a timing of it
    measured), or None where that kernel does not serve it."""
    return list(native.bf16_panel_layout()) if "native_bf16" in layer.kernels() else None


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if data.get("machine") == machine() else {}
    except (OSError, ValueError):
        return {}


def tune_kernels(
    model: nn.Module,
    *,
    cache: Path | None = None,
    retune: bool = False,
    certain: bool = False,
) -> dict:
    """Give every CPU `Linear` of `model` the plan measured fastest here (from the cache
    when this machine has timed that group before), else the plan predicted for this CPU
    (`kernel_plans`). Groups whose choice is uncertain (several candidates) are measured
    while the tuning budget lasts (`tuning_budget`), largest first; groups with one
    candidate take it untimed, and are timed (for `projection_seconds`) only when
    `certain` is set (`time_certain_groups`, after everything else). Returns
    {group: entry}; predicted entries carry "predicted": True."""
    cache = cache or kernel_cache()
    stored = {} if retune else stored_entries("groups", cache=cache)
    groups = _groups(model)
    stale = [key for key, layers in groups.items() if _stale(stored.get(key), layers)]
    stale.sort(key=lambda key: -groups[key][0].stored_bytes() * len(groups[key]))
    changed = False
    for key in stale:
        layers = groups[key]
        sure = kernel_plans.certain(layers[0])
        if sure and not certain:  # one candidate: taken untimed (timed last, if at all)
            pass
        elif tuning_budget.allows():
            with tuning_budget.measuring(f"kernels of {key}"):
                stored[key] = measure_group(layers)
            changed = True
            continue
        elif not sure:
            tuning_budget.skipped()
        entry = stored.get(key)
        if entry is None or not entry.get("predicted") or _predicted_stale(entry, layers):
            stored[key] = predicted_group(layers)
            changed = True
    chosen = {}
    for key, layers in groups.items():
        for layer in layers:
            layer.use({int(b): name for b, name in stored[key]["plan"].items()})
        chosen[key] = stored[key]
    if changed:
        store(cache, "groups", stored)
    return chosen


def time_certain_groups(model: nn.Module, *, cache: Path | None = None) -> dict:
    """Time the groups of `model` that took their one candidate untimed, while the budget
    lasts: their timings price a cold start of speculation (`projection_seconds`), which
    otherwise waits for the engine's own timings."""
    return tune_kernels(model, cache=cache, certain=True)


def predicted_group(layers: list[Linear]) -> dict:
    """A group's entry without timing: the plan `kernel_plans` predicts for this CPU."""
    plan = kernel_plans.predicted_plan(layers[0])
    return {
        "plan": {str(b): name for b, name in plan.items()},
        "predicted": True,
        "candidates": sorted(layers[0].candidates()),
        "panels": panels_timed(layers[0]),
    }


def _predicted_stale(entry: dict, layers: list[Linear]) -> bool:
    """Whether a predicted entry no longer fits this build (other candidates or panels)."""
    return (
        entry.get("candidates") != sorted(layers[0].candidates())
        or entry.get("panels") != panels_timed(layers[0])
        or set(entry["plan"]) != {str(b) for b in BUCKETS}
    )


def pending_groups(model: nn.Module, *, cache: Path | None = None) -> int:
    """How many of `model`'s groups with an uncertain plan are not measured yet."""
    stored = stored_entries("groups", cache=cache)
    return sum(
        1
        for key, layers in _groups(model).items()
        if _stale(stored.get(key), layers) and not kernel_plans.certain(layers[0])
    )


def _stale(entry: dict | None, layers: list[Linear]) -> bool:
    """Whether a group's stored entry must be measured (again): none yet, one from before a
    bucket existed or was timed at its lowest row count too, one timed in another bf16
    panel layout, or one that timed other candidates than this build has."""
    buckets = {str(b) for b in BUCKETS}
    if entry is None or entry.get("predicted"):
        return True
    if not set(entry["plan"]) == set(entry.get("seconds_low", {})) == buckets:
        return True
    if entry.get("panels") != panels_timed(layers[0]):  # timed in another panel layout
        return True
    return set(entry["seconds"][str(BUCKETS[0])]) != set(layers[0].candidates())


def stored_entries(name: str, *, cache: Path | None = None) -> dict:
    """The `name` section ("groups", "stacks") of this machine's kernel cache."""
    return _load(cache or kernel_cache()).get(name, {})


def store(cache: Path, name: str, entries: dict) -> None:
    """Write the `name` section of the kernel cache, keeping the others."""
    data = _load(cache) or {"machine": machine()}
    data[name] = entries
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")  # ranks of one machine may race
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(cache)


# Row counts the tile layout's prefetch level is timed at: a decode step and a k = 3 verify.
PREFETCH_ROWS = (1, 4)


def _sweep_settings(
    layers: list[nn.Module],
    settings: dict,
    kernel: str = "q4_native",
    row_counts: tuple[int, ...] = PREFETCH_ROWS,
) -> dict[str, dict[str, float]]:
    """{setting: {rows: seconds}}: the fastest of `REPEATS` sweeps through `layers` (in
    model order, as a decode step streams them) at each of `row_counts` under each setting
    (`settings`: name -> a callable that applies it), the settings taking turns (noise only
    adds time). Each layer runs its own entry of `kernel` (int4: `q4_native`), as a decode
    step's eager layers do. The caller restores what was set."""
    seed = torch.Generator().manual_seed(0)
    inputs = {
        (rows, width): torch.randn(rows, width, generator=seed).to(layers[0].weight.dtype)
        for rows in row_counts
        for width in sorted({layer.in_features for layer in layers})
    }
    best = {(name, rows): float("inf") for name in settings for rows in row_counts}
    with torch.inference_mode():
        for _ in range(REPEATS):
            for name, rows in best:
                settings[name]()
                start = time.perf_counter()
                for layer in layers:
                    layer.run(kernel, inputs[rows, layer.in_features])
                best[name, rows] = min(best[name, rows], time.perf_counter() - start)
    return {
        name: {str(rows): round(best[name, rows], 6) for rows in row_counts} for name in settings
    }


def measure_prefetch(layers: list[nn.Module]) -> dict:
    """Seconds of a sweep through `layers` (int4 layers in the tile layout) at each prefetch
    level and row count of `PREFETCH_ROWS` (`_sweep_settings`), and the level with the
    least sum."""
    levels = native.TILE_PREFETCH_LEVELS
    previous = native.tile_prefetch()
    try:
        seconds = _sweep_settings(
            layers, {str(level): partial(native.set_tile_prefetch, level) for level in levels}
        )
    finally:
        native.set_tile_prefetch(previous)
    level = min(levels, key=lambda lv: sum(seconds[str(lv)].values()))
    size = sum(layer.stored_bytes() for layer in layers)
    return {"level": level, "seconds": seconds, "bytes": size}


def tune_prefetch(model: nn.Module, *, cache: Path | None = None, retune: bool = False) -> dict:
    """Set the int4 tile layout's prefetch level (`native.set_tile_prefetch`) measured
    fastest here over `model`'s int4 layers in that layout, from the cache when this
    machine has timed it before. One level per process and machine: it is a property of
    the memory system, not of a shape. Returns the stored entry ({} where `model` has no
    such layers, and nothing is set)."""
    layers = _tiled_int4(model)
    if not layers or native.q4_gemv() is None:
        return {}
    cache = cache or kernel_cache()
    entry = {} if retune else stored_entries("tile_prefetch", cache=cache)
    if entry.get("level") not in native.TILE_PREFETCH_LEVELS or entry.get("predicted"):
        if tuning_budget.allows():
            with tuning_budget.measuring("int4 tile prefetch"):
                entry = measure_prefetch(layers)
            store(cache, "tile_prefetch", entry)
        else:
            tuning_budget.skipped()
            if entry.get("level") not in native.TILE_PREFETCH_LEVELS:
                entry = {"level": kernel_plans.predicted_prefetch(), "predicted": True}
                store(cache, "tile_prefetch", entry)
    native.set_tile_prefetch(entry["level"])
    return entry


# Row counts the bf16 panel layouts are timed at: a decode step, a k = 3 verify, a k = 7 one.
PANEL_ROWS = (1, 4, 8)


def _native_bf16_layers(model: nn.Module) -> list[Linear]:
    """`model`'s CPU `Linear` layers the native bf16 kernel serves, in model order."""
    return [
        m
        for m in model.modules()
        if isinstance(m, Linear) and m.device.type == "cpu" and "native_bf16" in m.kernels()
    ]


def measure_bf16_panels(layers: list[Linear]) -> dict:
    """Seconds of a sweep through `layers` at each row count of `PANEL_ROWS` with their
    weights in each panel layout the build reads (`_sweep_settings`: the eager native_bf16
    entry, the layouts taking turns), and the layout with the least sum. Packs each layout
    for these layers only, and gives them back the panels they held before."""
    packed = {
        f"{width}x{kstep}": [pack_panels(layer.rows(), width, kstep) for layer in layers]
        for width, kstep in native.bf16_panel_layouts()
    }
    held = [layer.formats.get("native_bf16") for layer in layers]

    def lay(panels: list) -> None:
        for layer, p in zip(layers, panels, strict=True):
            layer.formats["native_bf16"] = p

    try:
        seconds = _sweep_settings(
            layers,
            {name: partial(lay, panels) for name, panels in packed.items()},
            "native_bf16",
            PANEL_ROWS,
        )
    finally:
        lay(held)
        for layer in layers:
            if layer.formats["native_bf16"] is None:
                del layer.formats["native_bf16"]
    fastest = min(packed, key=lambda name: sum(seconds[name].values()))
    return {
        "layout": [int(n) for n in fastest.split("x")],
        "seconds": seconds,
        "bytes": sum(layer.stored_bytes() for layer in layers),
    }


def use_stored_bf16_panels(*, cache: Path | None = None) -> bool:
    """Pack bf16 weights from now on in the layout this machine timed before, if it has:
    called before a model is loaded, so its first packing is already in that layout
    (`tune_bf16_panels` would otherwise re-pack every layer, holding the weights a third
    time meanwhile). Returns whether a measured layout was put in force (else the one
    `kernel_plans` predicts for this CPU is)."""
    if len(native.bf16_panel_layouts()) < 2:
        return False
    entry = stored_entries("bf16_panels", cache=cache)
    layout = tuple(entry.get("layout", ()))
    if entry.get("predicted") or layout not in native.bf16_panel_layouts():
        # Nothing measured: pack in the predicted layout, what the load keeps unless its
        # tuning budget measures another (`tune_bf16_panels` then re-packs).
        native.set_bf16_panel_layout(kernel_plans.predicted_panels(native.bf16_panel_layouts()))
        return False
    native.set_bf16_panel_layout(layout)
    return True


def tune_bf16_panels(model: nn.Module, *, cache: Path | None = None, retune: bool = False) -> bool:
    """Pack bf16 weights for the native kernel in the panel layout timed fastest here
    (`native.set_bf16_panel_layout`), from the cache when this machine has timed it
    before; layers of `model` packed in another layout are packed again in it
    (`Linear.repack_panels`). One layout per process and machine:
    it is a property of the core's arithmetic, and two layouts of one model would hold its
    weights three times. Timed over the first layers of `model` that hold 2 `SWEEP_BYTES`.

    Why measured: in AVX-512 BF16 builds the pair layout (`vdpbf16ps`) passed 5-8 rows
    1.25-1.58x faster than the fp32-FMA panels on a Zen 4 and 0.77-0.87x as fast on a Xeon
    with AMX (1 row: the same on both). Returns whether panels were re-packed (the caller
    rebuilds the model's decode stack, which holds the tensors it was built with)."""
    layers = _native_bf16_layers(model)
    if not layers or len(native.bf16_panel_layouts()) < 2:
        return False
    cache = cache or kernel_cache()
    if (retune or not use_stored_bf16_panels(cache=cache)) and tuning_budget.allows():
        swept, size = [], 0
        for layer in layers:
            if size >= 2 * SWEEP_BYTES:
                break
            swept.append(layer)
            size += layer.stored_bytes()
        with tuning_budget.measuring("bf16 panel layouts"):
            entry = measure_bf16_panels(swept)
        store(cache, "bf16_panels", entry)
        native.set_bf16_panel_layout(tuple(entry["layout"]))
    elif not use_stored_bf16_panels(cache=cache):  # nothing measured, no budget left
        tuning_budget.skipped()
        layout = kernel_plans.predicted_panels(native.bf16_panel_layouts())
        if stored_entries("bf16_panels", cache=cache).get("layout") is None:
            store(cache, "bf16_panels", {"layout": list(layout), "predicted": True})
        native.set_bf16_panel_layout(layout)
    repacked = [layer.repack_panels() for layer in layers]
    return any(repacked)


def _tiled_int4(model: nn.Module) -> list[nn.Module]:
    """`model`'s CPU int4 layers that hold the tile layout, in model order."""
    return [
        m
        for m in model.modules()
        if isinstance(m, Int4Linear) and m.tiles.numel() and m.device.type == "cpu"
    ]


def measure_layout(layers: list[nn.Module]) -> dict:
    """Seconds of a sweep through `layers` (one group of int4 layers) at each row count of
    `PREFETCH_ROWS` in the tile layout and in rows (`_sweep_settings`: `q4_native` reads
    the tiles where a layer holds them, the rows where it does not), and whether the
    tiles were faster in sum."""
    tiles = [layer.tiles for layer in layers]
    rows_only = torch.empty(0, dtype=torch.uint8)

    def lay(laid: bool) -> None:
        for layer, t in zip(layers, tiles, strict=True):
            layer.tiles = t if laid else rows_only

    try:
        seconds = _sweep_settings(
            layers, {"tiles": partial(lay, True), "rows": partial(lay, False)}
        )
    finally:
        lay(True)
    return {
        "tiles": keeps_tiles(seconds),
        "seconds": seconds,
        "layers": len(layers),
        "rule": LAYOUT_RULE,
    }


# What `keeps_tiles` decides by (stored with each choice: a choice made by another rule is
# timed again).
LAYOUT_RULE = "no slower at one row, faster at one and four"


def keeps_tiles(seconds: dict[str, dict[str, float]]) -> bool:
    """Whether a group keeps the tile layout, from `measure_layout`'s seconds: no slower
    than rows at one row (every decode step's width, speculative or not) and faster at one
    and four rows together. The sum alone kept tiles that were 8-10% slower at one row on a
    Zen 3 (the 1.5B's qkv and gate/up), and int4 plain decoding ran 0.93x rows (95% interval
    0.91-0.95 over 36 paired requests) for k = 3 speculation at 1.03x (0.97-1.11 over 30):
    docs/benchmarks.md, "AVX2: AMD EPYC Zen 3"."""
    tiles, rows = seconds["tiles"], seconds["rows"]
    return tiles["1"] <= rows["1"] and sum(tiles.values()) < sum(rows.values())


def tune_layout(model: nn.Module, *, cache: Path | None = None, retune: bool = False) -> dict:
    """Keep the int4 tile layout only in the groups of `model`'s layers where it was timed
    no slower here than the row layout at one row and faster at one and four (a decode
    step, a k = 3 verify pass; `keeps_tiles`); the other groups drop their tiles and run in
    rows. Stored per machine (the kernel cache's `tile_layout` section, keyed by the tiled
    group), so a later process reads the choice. Run after `tune_prefetch` (the tiles
    stream at its level) and before `tune_kernels` (a group's plan is timed in the layout
    it keeps; `group_key` names it).

    Why measured: on a Zen 4 one row of the 0.5B's head streamed 1.2x faster in rows, so
    draft models kept rows by rule; on an Intel Xeon with AMX the same 0.5B decodes a token
    in 14.0 ms with tiles against 20.3 ms in rows. Returns {group: entry}; the caller
    rebuilds the model's decode stack, which holds the tensors it was built with."""
    layers = _tiled_int4(model)
    if not layers or native.q4_gemv() is None:
        return {}
    groups: dict[str, list[nn.Module]] = defaultdict(list)
    for layer in layers:
        groups[group_key(layer)].append(layer)
    cache = cache or kernel_cache()
    stored = {} if retune else stored_entries("tile_layout", cache=cache)
    missing = [key for key in groups if _layout_pending(stored.get(key))]
    for key in missing:
        if tuning_budget.allows():
            with tuning_budget.measuring(f"int4 tile layout of {key}"):
                stored[key] = measure_layout(groups[key])
        else:
            tuning_budget.skipped()
            if not isinstance(stored.get(key, {}).get("tiles"), bool):
                stored[key] = {"tiles": kernel_plans.predicted_tiles(), "predicted": True}
    if missing:
        store(cache, "tile_layout", stored)
    for key, group in groups.items():
        if not stored[key]["tiles"]:
            for layer in group:
                layer.tiles = torch.empty(0, dtype=torch.uint8)
    return {key: stored[key] for key in groups}


def _layout_pending(entry: dict | None) -> bool:
    if entry is None or entry.get("predicted") or entry.get("rule") != LAYOUT_RULE:
        return True
    return not isinstance(entry.get("tiles"), bool)


def pending_steps(model: nn.Module, *, cache: Path | None = None) -> int:
    """How many uncertain choices of `model` this machine has not measured yet (what a
    load would time, budget permitting): the tile prefetch, the bf16 panel layout, each
    tiled group's layout and each uncertain group's kernels (the decode stack counts apart,
    `decode_stack.pending`). Group keys after a layout change may differ: an estimate."""
    cache = cache or kernel_cache()
    n = 0
    tiled = _tiled_int4(model) if native.q4_gemv() is not None else []
    if tiled:
        entry = stored_entries("tile_prefetch", cache=cache)
        n += entry.get("level") not in native.TILE_PREFETCH_LEVELS or bool(entry.get("predicted"))
        stored = stored_entries("tile_layout", cache=cache)
        n += sum(_layout_pending(stored.get(key)) for key in {group_key(m) for m in tiled})
    if _native_bf16_layers(model) and len(native.bf16_panel_layouts()) > 1:
        entry = stored_entries("bf16_panels", cache=cache)
        layout = tuple(entry.get("layout", ()))
        n += bool(entry.get("predicted")) or layout not in native.bf16_panel_layouts()
    return n + pending_groups(model, cache=cache)


def projection_seconds(model: object, *, cache: Path | None = None) -> dict[int, float]:
    """{rows: seconds} of one pass of `rows` rows (each bucket of `BUCKETS`) through every
    CPU projection of `model`, summed from the timings `tune_kernels` stored here for the
    kernel each layer's plan runs at that bucket. Empty when any projection has no plan
    or no stored timing for it (untuned models, GPU, another machine's cache): a model
    is never priced from part of its layers.

    A stored timing is seconds per layer (a sweep over the group's layers divided by the
    layers it swept, fewer past 16 rows), so each layer of the model counts it once. The
    level follows the machine's load while tuning ran (the 1.5B's bf16 groups here sum
    to 0.89 s at one row, its decode step measures 0.25 s), so callers use ratios: a
    pass of n rows over one of m of the same model, which a uniformly busier machine
    leaves alone, and the draft over the target, which two tunings under different loads
    do not."""
    groups = _groups(model) if isinstance(model, nn.Module) else {}
    stored = _load(cache or kernel_cache()).get("groups", {}) if groups else {}
    total = dict.fromkeys(BUCKETS, 0.0)
    for key, layers in groups.items():
        seconds = stored.get(key, {}).get("seconds", {})
        for layer in layers:
            for rows in BUCKETS:
                s = seconds.get(str(rows), {}).get(layer.plan.get(rows))
                if s is None:
                    return {}
                total[rows] += s
    return total if groups else {}
