"""What a benchmark run measures: presets, methods and the points of the sweep.

A point is one (workload, prompt length, batch size, temperature, method) cell. Its `key`
is what results.json is resumed by, so it names every field that changes a measurement
and nothing else (prices and plots do not).

Plain decoding comes first in every group of points that share all but the method: the
speedups of the others are relative to it, and a run stopped half way still has them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specdec.errors import InvalidParameterError

# How finely a group's methods take turns (`specdec bench --interleave`): a round (one
# `generate` over a batch of the point's prompts, peers' too) or, for our engines, one
# engine step (`Engine.generate_steps`; peers still take whole rounds).
INTERLEAVES = ("rounds", "steps")

WORKLOADS = ("code", "sharegpt", "synthetic", "edits")  # edits: `specdec.bench.edits`
# Methods whose prompt length comes from the prompts themselves; synthetic prompts are cut
# to each --prompt-lens value.
NATURAL_LENGTH = ("code", "sharegpt", "edits")
PEERS = ("hf-generate", "hf-assisted", "llamacpp", "vllm")  # and vllm-draft-kN (`is_peer`)
# Peers that decode one sequence at a time (transformers' assisted generation and
# llama-cpp-python's high-level API): planned at batch 1 only.
BATCH1_ONLY = ("hf-assisted", "llamacpp")
_METHOD = re.compile(
    r"^(plain|draft-k\d+|(draft|ngram|heads|suffix)-auto(-warm)?|(ngram|suffix)-k\d+|heads-k\d+|"
    r"heads-tree|"
    r"hf-generate|hf-assisted|llamacpp|vllm|vllm-draft-k\d+)$"
)


def vllm_draft_k(method: str) -> int | None:
    """For a vLLM method, the tokens its draft model proposes per step (0: `vllm`, plain);
    None for any other method."""
    if method == "vllm":
        return 0
    match = re.fullmatch(r"vllm-draft-k(\d+)", method)
    return int(match.group(1)) if match else None


def is_peer(method: str) -> bool:
    """Another implementation (transformers, llama.cpp, vLLM), not one of ours."""
    return method in PEERS or vllm_draft_k(method) is not None


@dataclass(frozen=True)
class Preset:
    """Defaults of one sweep; every field can be overridden on the command line."""

    model: str
    draft: str
    workloads: tuple[str, ...]
    prompt_lens: tuple[int, ...]
    batches: tuple[int, ...]
    temperatures: tuple[float, ...]
    methods: tuple[str, ...]
    max_tokens: int
    prompts_per_point: int  # at least the batch size: one full batch per point
    curve_ks: tuple[int, ...]  # the verify-cost curve, k = 0..16 in the full preset
    repeats: int  # runs per point, the median kept


PRESETS = {
    # Within 5 minutes on a 2-core CPU: SmolLM2 drafts for itself with int4 weights (same
    # tokenizer, a genuinely cheaper draft, high acceptance), code prompts, batch 1 and 4,
    # greedy and sampled; the long sweep is the full preset. (With a synthetic 256-token
    # workload too it took 8 min 11 s on a Zen 3, and 3 min 11 s without.)
    "quick": Preset(
        model="smollm2-135m-instruct",
        draft="smollm2-135m-instruct",
        workloads=("code",),
        prompt_lens=(256,),
        batches=(1, 4),
        temperatures=(0.0, 1.0),
        methods=("plain", "draft-auto", "ngram-auto", "hf-generate"),
        max_tokens=32,
        # Four requests a point: one 32-token request (0.6 s at batch 1) swung by more than
        # the 3% the `auto` >= 0.97x plain check judges.
        prompts_per_point=4,
        curve_ks=(0, 1, 2, 4, 8),
        repeats=2,
    ),
    # The published erosion table on the default pair: hours on this CPU (resumable).
    "full": Preset(
        model="qwen2.5-coder-1.5b-instruct",
        draft="qwen2.5-coder-0.5b-instruct",
        workloads=("code", "sharegpt", "synthetic"),
        prompt_lens=(64, 256, 1024),
        batches=(1, 2, 4, 8, 16),
        temperatures=(0.0, 1.0),
        methods=(
            "plain",
            "draft-k2",
            "draft-k4",
            "draft-k8",
            "draft-auto",
            "ngram-auto",
            "hf-generate",
            "hf-assisted",
            "llamacpp",
        ),
        max_tokens=128,
        prompts_per_point=4,
        curve_ks=tuple(range(17)),
        repeats=1,
    ),
}


@dataclass(frozen=True)
class Point:
    workload: str
    prompt_len: int | None  # None: the workload's own prompts, whatever their length
    batch: int
    temperature: float
    method: str

    @property
    def group(self) -> str:
        """Everything but the method: the points that share one plain baseline."""
        length = "natural" if self.prompt_len is None else self.prompt_len
        return f"{self.workload}|len={length}|batch={self.batch}|temp={self.temperature:g}"

    @property
    def cost_key(self) -> str:
        """What the measured costs depend on: batch size and context, not temperature."""
        length = "natural" if self.prompt_len is None else self.prompt_len
        return f"{self.workload}|len={length}|batch={self.batch}"

    @property
    def key(self) -> str:
        return f"{self.group}|{self.method}"

    @property
    def warm_start(self) -> bool:
        """An `auto` method whose each run starts from what its previous run measured (the
        costs and acceptance `specdec.window.cache` hands a fresh process), as repeated
        `specdec generate` calls run it; plain `-auto` starts every run from nothing."""
        return self.method.endswith("-auto-warm")

    @property
    def window(self) -> int | str | None:
        """k for a fixed-window method, "auto", "tree", or None (plain and peers)."""
        if is_peer(self.method):
            return None
        if self.method.endswith(("-auto", "-auto-warm")):
            return "auto"
        if self.method == "heads-tree":
            return "tree"
        match = re.search(r"-k(\d+)$", self.method)
        return int(match.group(1)) if match else None


def check_methods(methods: tuple[str, ...]) -> None:
    bad = [m for m in methods if not _METHOD.match(m)]
    if bad:
        raise InvalidParameterError(
            f"unknown method(s) {', '.join(bad)}: use plain, draft-kN, draft-auto, ngram-auto, "
            "ngram-kN, suffix-auto, suffix-kN, heads-kN, heads-auto, heads-tree, draft-auto-warm, "
            "ngram-auto-warm, "
            "heads-auto-warm, hf-generate, hf-assisted, llamacpp, vllm, vllm-draft-kN"
        )
    if "plain" not in methods:
        raise InvalidParameterError("the methods must include plain (speedups are relative to it)")


def build_points(preset: Preset) -> list[Point]:
    """Every point of the sweep, plain first in each group, cheap groups first (batch 1
    and short prompts), so a stopped run already holds a usable table."""
    check_methods(preset.methods)
    bad = [w for w in preset.workloads if w not in WORKLOADS]
    if bad:
        raise InvalidParameterError(f"unknown workload(s) {bad}; use {', '.join(WORKLOADS)}")
    methods = ["plain"] + [m for m in preset.methods if m != "plain"]
    points = []
    for temperature in preset.temperatures:
        for batch in preset.batches:
            for workload in preset.workloads:
                lengths = (None,) if workload in NATURAL_LENGTH else preset.prompt_lens
                for length in lengths:
                    for method in methods:
                        if method in BATCH1_ONLY and batch != 1:
                            continue
                        points.append(Point(workload, length, batch, temperature, method))
    return points


def override(preset: Preset, **fields) -> Preset:
    """The preset with the fields given (not None) replaced."""
    return replace(preset, **{k: v for k, v in fields.items() if v is not None})
