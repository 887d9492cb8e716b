"""`EngineArgs`: every option of a loaded target and its drafter, validated in one place.

`LLM`, `specdec generate`, `serve` and `bench` are all built from it: a field with a `flag`
in its metadata is a command-line option of each (`add_cli_args`, `from_cli_args`), so a new
option is written once, here. Validation runs before any weights load.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.drafters.kinds import DraftSpec, parse_draft
from specdec.drafters.suffix import DEFAULT_STORE_TOKENS, MAX_STORE_TOKENS
from specdec.errors import InvalidParameterError

QUANTS = ("none", "int4", "int8")
DTYPES = ("bf16", "fp32")
MAX_WINDOW = 32  # the largest window a step may draft


def _opt(default: Any, help: str, flag: str | None = None, **argparse_kwargs) -> Any:
    """A field with its command-line flag (`--name` from the field's name unless given)."""
    meta = {"help": help, "flag": flag, "argparse": argparse_kwargs}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class EngineArgs:
    """A target, its drafter, the window and acceptor, and how they run. See the CLI
    reference (docs/reference/cli.md) for each option in words."""

    model: str = _opt(None, "registry name, HF directory or .gguf file")
    draft: str | None = _opt(
        None,
        "the drafter: ngram | suffix | model:NAME | heads:DIR | eagle:DIR | eagle3:DIR (a bare "
        "model name or heads directory works too); suffix+model:NAME (or suffix+heads:DIR, "
        "...) combines suffix decoding with that drafter, each row drafting from whichever "
        "expects more tokens accepted",
    )
    suffix_tokens: int = _opt(
        DEFAULT_STORE_TOKENS,
        "with --draft suffix or suffix+...: tokens of past requests kept to draft from "
        "(oldest evicted first; at most 4,194,304)",
        type=int,
    )
    speculate: int | str | None = _opt(
        None, "tokens drafted per step, or 'auto' (default with --draft)"
    )
    k_max: int = _opt(8, "largest window 'auto' may choose", type=int)
    tree: str | tuple[int, ...] | None = _opt(
        None,
        "with speculator or eagle heads: top-k per draft position, e.g. 4,3,2, to draft "
        "candidate trees verified in one pass (lossless for greedy and sampling)",
    )
    n_candidates: int | None = _opt(None, "paths kept per tree (default: all)", type=int)
    acceptor: Any = _opt(
        "rejection", "rejection (lossless) | greedy | typical (lossy) | module:Class"
    )
    quant: str = _opt(
        "none",
        "target weights in 4 or 8 bits, quantized at load (the model that runs: lossless "
        "acceptors reproduce its plain decoding)",
        choices=list(QUANTS),
    )
    draft_quant: str | None = _opt(
        None,
        "draft model weights in 4 bits (default on CPU; lossless: only q changes)",
        choices=list(QUANTS),
    )
    draft_vocab: int | None = _opt(
        None,
        "the draft model scores only ShareGPT's N most frequent ids and each request's own "
        "(a cheaper draft step; lossless: only q changes; 0 = all; default on a CPU: the "
        "65,536 lowest ids and each request's own)",
        type=int,
    )
    dtype: str = _opt("bf16", "weights and activations", choices=list(DTYPES))
    device: str = _opt("cpu", "cpu or cuda[:N]")
    tp: int = _opt(1, "tensor-parallel ranks (under torchrun)", type=int)
    draft_tp: int = _opt(1, "1 (replicated draft) or --tp", type=int)
    learn: bool = _opt(
        False,
        "train the --draft speculator (or eagle, eagle3) heads on the requests answered, between "
        "engine steps and while idle, checkpointing into that directory (an empty or new one "
        "starts untrained heads)",
        action="store_true",
    )
    learn_budget: float = _opt(
        0.25, "share of the engine's wall time training may take while serving", type=float
    )
    learn_lr: float | None = _opt(
        None,
        "the learner's AdamW rate after its warm-up (default 1e-3 for MLP heads, 3e-5 for an "
        "eagle head, which arrives trained)",
        type=float,
    )
    learn_replay: float = _opt(
        0.5,
        "share of the learner's windows replayed from the stage-2 data the trainer left in "
        "the heads directory (its stage2/ folder), where there is some; 0: traffic only",
        type=float,
    )
    learn_heads: int = _opt(3, "heads of untrained --learn heads", type=int)
    cuda_graphs: bool = _opt(
        True,
        "on a GPU, run every pass eagerly instead of replaying CUDA graphs",
        flag="--no-cuda-graphs",
        action="store_false",
    )
    fused_layers: bool = _opt(
        True,
        "on a GPU, replay the model's own layers, never the compiled (fused) ones",
        flag="--no-fused-layers",
        action="store_false",
    )
    prefix_cache_tokens: int = _opt(
        4096,
        "positions of recent prompts' keys and values kept, so a request that starts the "
        "same way (a system turn, an earlier turn) prefills only the rest (0 = off)",
        flag="--prefix-cache",
        type=int,
        metavar="TOKENS",
    )
    prefill_chunk: int | str | None = _opt(
        "auto",
        "prefill long prompts in passes of at most this many positions, the requests "
        "admitted together sharing them (0 = one pass; auto: 512 on a CPU, where one long "
        "pass's large tensors fault in fresh pages, one pass on a GPU)",
        metavar="TOKENS",
    )
    # Set by the caller, not by flags: each command names them its own way.
    max_batch: int = 8  # sequences decoded together
    max_len: int | None = None  # a fixed KV cache length per sequence (a server's budget)
    learn_config: Any = None  # a training.online.LearnConfig; built from learn_* when None
    draft_spec: DraftSpec | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.model:
            raise InvalidParameterError("a target model is needed (--model)")
        spec = parse_draft(self.draft)
        if self.learn and spec is not None and spec.kind == "model" and _empty(spec.value):
            spec = DraftSpec("heads", spec.value)  # --learn starts untrained heads there
        object.__setattr__(self, "draft_spec", spec)
        if self.tree is not None:
            object.__setattr__(self, "tree", parse_tree(self.tree))
        self._validate(spec)

    def _validate(self, spec: DraftSpec | None) -> None:
        check = _checker()
        for name in ("quant", "draft_quant"):
            value = getattr(self, name)
            check(value is None or value in QUANTS, f"{name} must be one of {', '.join(QUANTS)}, "
                  f"got {value!r}")  # fmt: skip
        check(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check(1 <= self.k_max <= MAX_WINDOW,
              f"k_max must be in [1, {MAX_WINDOW}], got {self.k_max}")  # fmt: skip
        parse_speculate(self.speculate)
        check(self.max_batch >= 1, f"max_batch must be >= 1, got {self.max_batch}")
        check(self.tp >= 1, f"tp must be >= 1, got {self.tp}")
        check(self.draft_tp in (1, self.tp), f"draft_tp must be 1 or tp ({self.tp}), got "
              f"{self.draft_tp}")  # fmt: skip
        heads = spec is not None and spec.reads_states
        check(not (self.draft_tp > 1 and heads), "speculator heads are replicated on every rank "
              "(they are small): use --draft-tp 1 with them")  # fmt: skip
        if self.draft_vocab is not None:
            check(self.draft_vocab >= 0, f"draft_vocab must be >= 0, got {self.draft_vocab}")
            check(not self.draft_vocab or (spec is not None and spec.kind == "model"),
                  "--draft-vocab cuts a draft model's vocabulary head: it needs a draft model "
                  "as --draft (speculator heads take theirs from train-speculator "
                  "--draft-vocab)")  # fmt: skip
            check(not (self.draft_vocab and self.draft_tp > 1),
                  "--draft-vocab needs --draft-tp 1 (a whole draft head)")  # fmt: skip
        if self.learn:
            check(self.tp == 1, "learning while serving runs with --tp 1 only")
            check(heads, "--learn needs a speculator directory as --draft")
        check(self.tree is None or heads, "--tree needs speculator heads as --draft")
        hybrid = spec is not None and spec.with_suffix
        check(not (hybrid and self.tree is not None), "--tree drafts trees; a suffix+ hybrid "
              "drafts chains: drop --tree or the suffix+")  # fmt: skip
        check(not (hybrid and self.learn), "--learn trains heads on their own drafts; a "
              "suffix+ hybrid drafts some rows from the suffix store: drop one")  # fmt: skip
        check(self.n_candidates is None or self.n_candidates >= 1,
              f"n_candidates must be >= 1, got {self.n_candidates}")  # fmt: skip
        check(0 <= self.suffix_tokens <= MAX_STORE_TOKENS, "the suffix store's budget must be "
              f"0..{MAX_STORE_TOKENS} tokens, got {self.suffix_tokens}")  # fmt: skip
        check(self.prefix_cache_tokens >= 0,
              f"prefix cache must be >= 0 positions, got {self.prefix_cache_tokens}")  # fmt: skip

    @property
    def window(self) -> int | str:
        """The window to build: `speculate`, defaulting to "auto" with a drafter, else 0."""
        if self.speculate is not None:
            return parse_speculate(self.speculate)
        return 0 if self.draft_spec is None else "auto"

    def replace(self, **changes) -> EngineArgs:
        return dataclasses.replace(self, **changes)

    # --- the command line ---

    @classmethod
    def add_cli_args(
        cls, parser: argparse.ArgumentParser, *, only=None, defaults: dict | None = None
    ) -> None:
        """Add a flag for each field that has one (`only`: those names), with `defaults`
        overriding the fields' own (a command whose preset fills them in)."""
        defaults = defaults or {}
        for f in dataclasses.fields(cls):
            if "flag" not in f.metadata or (only is not None and f.name not in only):
                continue
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            kwargs = dict(f.metadata["argparse"])
            default = defaults.get(f.name, f.default)
            if f.name == "model" and "model" not in defaults:
                kwargs["required"] = True
            parser.add_argument(flag, dest=f.name, default=default, help=f.metadata["help"],
                                **kwargs)  # fmt: skip

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, **fields) -> EngineArgs:
        """The EngineArgs of parsed flags (`fields`: the caller's own, e.g. max_batch)."""
        flagged = {f.name for f in dataclasses.fields(cls) if "flag" in f.metadata}
        given = {k: v for k, v in vars(args).items() if k in flagged}
        return cls(**{**given, **fields})


def _empty(value: str | None) -> bool:
    """A path that does not exist yet, or an empty directory."""
    path = Path(str(value)).expanduser()
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def _checker():
    def check(ok: bool, message: str) -> None:
        if not ok:
            raise InvalidParameterError(message)

    return check


def parse_speculate(speculate: int | str | None) -> int | str | None:
    """`--speculate K|auto` checked: an int in [0, MAX_WINDOW], "auto", or None."""
    if speculate is None or speculate == "auto":
        return speculate
    try:
        k = int(speculate)
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"speculate must be an integer or 'auto', got {speculate!r}"
        ) from None
    if not 0 <= k <= MAX_WINDOW:
        raise InvalidParameterError(f"speculate must be in [0, {MAX_WINDOW}] or 'auto', got {k}")
    return k


def parse_tree(tree) -> tuple[int, ...] | None:
    """ "4,3,2" or (4, 3, 2) -> (4, 3, 2); None stays None."""
    if tree is None or isinstance(tree, tuple | list):
        return None if tree is None else tuple(int(k) for k in tree)
    try:
        return tuple(int(k) for k in str(tree).split(","))
    except ValueError:
        raise InvalidParameterError(f"tree must look like 4,3,2, got {tree!r}") from None
