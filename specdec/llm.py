"""The Python API: one object that loads a target (and optionally a drafter) and generates.

    >>> from specdec import LLM, SamplingParams          # doctest: +SKIP
    >>> llm = LLM("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
    ...           speculate="auto")                       # doctest: +SKIP
    >>> llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=32))[0].text

This is the one builder behind the CLI and the server: names of drafters, acceptors and
windows are resolved here, once, never inside the decoding loop.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import logging
import os
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch

from specdec.acceptors import ACCEPTORS, TokenAcceptor
from specdec.config import SamplingParams
from specdec.cost_cache import cost_file, load_acceptance, load_costs, save_costs
from specdec.cost_model import AdaptiveWindow, FixedWindow
from specdec.distributed import (
    check_tp_split,
    init_tensor_parallel,
    reports_failures,
    shared_seeds,
    shared_window,
)
from specdec.drafters import DraftModelDrafter, EagleDrafter, NgramDrafter, SpeculatorDrafter
from specdec.drafters.draft_model import check_same_tokenizer
from specdec.drafters.draft_vocab import (
    AUTO_DRAFT_VOCAB,
    frequent_ids,
    head_rows,
    lowest_ids,
    prune_vocab_head,
)
from specdec.engine import Completion, Engine, resolve_prefill_chunk
from specdec.errors import InvalidParameterError, SpecdecError
from specdec.models.first_load import prepare_cpu, tune_layers, tune_model
from specdec.models.quant import QUANTS
from specdec.models.quant_load import load_model
from specdec.models.static_pass import use_static_passes
from specdec.speculator.eagle import is_eagle_dir, load_eagle
from specdec.speculator.model import is_speculator_dir, load_speculator
from specdec.tokenization import encode_prompt, eos_token_ids, load_tokenizer

log = logging.getLogger(__name__)

MAX_WINDOW = 32


class LLM:
    """A loaded target model plus its tokenizer and, optionally, a drafter.

    draft: None (plain decoding), "ngram" (prompt lookup), a model name / path sharing
        the target's tokenizer, or a directory of speculator heads trained for this target
        (`specdec train-speculator`; their config.json says "mlp_speculator"), or of an
        eagle head (one layer over the target's states; "specdec_eagle").
    speculate: tokens drafted per step (int, 0 = off) or "auto" (chosen each step from the
        measured acceptance and costs, up to `k_max`). Defaults to "auto" with a drafter.
    acceptor: "rejection" (lossless, default), "greedy" (lossless for greedy requests),
        "typical" (lossy), "module:Class" (a user's TokenAcceptor), or an instance.
    max_len: a fixed KV cache length per sequence (a server's memory budget); None sizes
        the cache to each batch of requests.
    quant: "none" (default), "int4" or "int8": the target's projections in 4 or 8 bits,
        quantized at load (a quarter or half of bf16's bytes per step). The quantized model
        is the model that runs: lossless acceptors reproduce its plain decoding.
    draft_quant: "int4" (default on CPU) stores the draft model's projections in 4 bits,
        halving a draft step's cost; it changes only q, which the lossless acceptors
        correct, never the output distribution. "none" keeps the draft in `dtype`.
    Every CPU projection runs the kernel measured fastest on this machine for its shape and
    row count (`specdec.models.kernel_tuning`; timed once per machine, then cached).
    tp: tensor-parallel ranks for the target, launched by `torchrun --nproc-per-node tp`;
        every rank builds the same LLM and calls `generate` with the same prompts.
    draft_tp: 1 (default: every rank runs the whole draft model, no communication) or
        `tp` (the draft is sharded like the target).
    tree: with speculator or eagle heads, the top-k per draft position ("4,3,2"): each step
        drafts a candidate tree of the best `n_candidates` paths (default: all), verified
        in one target pass (`specdec.speculator.tree`); lossless with the rejection and
        greedy acceptors.
    learn: with speculator heads (or an eagle head), train them on the requests this LLM
        answers while it serves (`specdec.speculator.online`), checkpointing into the
        heads directory; a directory without heads starts untrained ones (`learn_heads` of
        them, reusing the target's tables). `learn_config` (a LearnConfig) sets the budget
        and sizes; `learner` then holds the trainer and its metrics. Output stays lossless.
    cuda_graphs: on a CUDA device (default on), the target's decode and verify passes,
        the draft model's steps and the heads' drafting run as CUDA graphs captured per
        bucket of (rows, tokens per row) (`specdec.models.static_pass`); False is the
        eager fallback (`--no-cuda-graphs`). Ignored on the CPU, whose passes stay eager,
        and under tensor parallelism (not captured yet).
    fused_layers: with CUDA graphs (default on), the target's and the draft model's
        passes may run their layers compiled by TorchInductor (`specdec.models.
        fused_layers`): the first capture races them against the model's own layers and
        keeps the faster. False keeps the model's own (`--no-fused-layers`).
    prefix_cache_tokens: positions of recent prompts' and finished requests' keys and
        values kept for reuse (default 4096; 0 = off): a request starting like one of them
        (a shared system turn, an earlier turn of the conversation) prefills only the rest,
        for the target and a draft model alike (`specdec.models.prefix_cache`).
    prefill_chunk: prefill long admissions in passes of at most this many positions, their
        requests together, over the growing cache (`Engine`; same tokens): "auto" (default)
        is `engine.PREFILL_CHUNK_CPU` on a CPU and one pass on a GPU; 0 is one pass.
    """

    @reports_failures()  # tensor parallelism: a rank that cannot load must not hang the others
    def __init__(
        self,
        model: str,
        *,
        draft: str | None = None,
        speculate: int | str | None = None,
        acceptor: str | TokenAcceptor = "rejection",
        k_max: int = 8,
        quant: str = "none",
        draft_quant: str | None = None,
        draft_vocab: int | None = None,
        dtype: str = "bf16",
        device: str = "cpu",
        max_batch: int = 8,
        max_len: int | None = None,
        tp: int = 1,
        draft_tp: int = 1,
        tree: str | Sequence[int] | None = None,
        n_candidates: int | None = None,
        learn: bool = False,
        learn_config=None,
        learn_heads: int = 3,
        cuda_graphs: bool = True,
        prefix_cache_tokens: int = 4096,
        fused_layers: bool = True,
        prefill_chunk: int | str | None = "auto",
    ) -> None:
        from specdec.models.registry import gguf_source, resolve

        self.prefill_chunk = resolve_prefill_chunk(prefill_chunk, device)  # before any load

        self.tp = init_tensor_parallel(tp, device)  # None for tp = 1; checks WORLD_SIZE
        if draft_tp not in (1, tp):
            raise InvalidParameterError(f"draft_tp must be 1 or tp ({tp}), got {draft_tp}")
        heads = draft is not None and (is_speculator_dir(draft) or is_eagle_dir(draft))
        if draft_tp > 1 and heads:
            raise InvalidParameterError(
                "speculator heads are replicated on every rank (they are small): "
                "use --draft-tp 1 with them"
            )
        self.draft_tp = draft_tp
        if draft_vocab is not None and draft_vocab < 0:
            raise InvalidParameterError(f"draft_vocab must be >= 0, got {draft_vocab}")
        if draft_vocab and (draft is None or draft == "ngram" or heads):
            raise InvalidParameterError(
                "--draft-vocab cuts a draft model's vocabulary head: it needs a draft model "
                "as --draft (speculator heads take theirs from train-speculator --draft-vocab)"
            )
        if draft_vocab and draft_tp > 1:
            raise InvalidParameterError("--draft-vocab needs --draft-tp 1 (a whole draft head)")
        self.draft_vocab = draft_vocab
        self.draft_head = None  # what a draft model's vocabulary head scores, in words
        static, graphs = use_static_passes(torch.device(device), None, cuda_graphs)
        # Engine and drafter options, shared by every engine built on this LLM.
        self.engine_options = {
            "static_passes": static and self.tp is None,
            "cuda_graphs": graphs and self.tp is None,
        }

        window = build_window(
            speculate if speculate is not None else (0 if draft is None else "auto"), k_max
        )
        acceptor = build_acceptor(acceptor)
        for name, value in (("quant", quant), ("draft_quant", draft_quant)):
            if value is not None and value not in QUANTS:
                raise InvalidParameterError(
                    f"{name} must be one of {', '.join(QUANTS)}, got {value!r}"
                )
        path = resolve(model, dtype)
        self.name = model
        self.tokenizer = load_tokenizer(path)
        self.eos_ids = eos_token_ids(path, self.tokenizer)
        if self.tp is not None:  # each rank on its own device; refuse bad splits before loading
            device = self.tp.device
            check_tp_split(path, draft if draft_tp > 1 else None, dtype, tp)
        # int4 from a Q4_K GGUF runs the file's own 4-bit blocks (a shard re-quantizes).
        source = gguf_source(model) if quant == "int4" and self.tp is None else None
        if torch.device(device).type == "cpu":
            prepare_cpu()  # native builds; pack once, in the layout this machine timed
        # Streamed into its quantized layers, refused up front where it would not fit.
        self.model = _tuned(load_model(path, dtype, device, quant, source, self.tp, "the target"))
        self.layer_stack = None if fused_layers else "eager"  # raced at the first capture
        self.model.layer_stack = self.layer_stack
        self.quant = quant
        if draft_quant is None:
            draft_quant = "int4" if torch.device(device).type == "cpu" else "none"
        self.draft_quant = draft_quant
        self.speculator = self.learner = self.eagle = None
        self.learning = learn
        self.tree = _parse_tree(tree)
        self.n_candidates = n_candidates
        if learn:
            if tp > 1:
                raise InvalidParameterError("learning while serving runs with --tp 1 only")
            if draft is None or draft == "ngram":
                raise InvalidParameterError("--learn needs a speculator directory as --draft")
            _new_heads_if_empty(draft, self.model, learn_heads)
        factory = self._drafter_factory(draft, dtype, device, draft_quant) if draft else None
        if learn:
            from specdec.speculator.online import OnlineLearner

            if self.eagle is not None:  # trains the loaded head, serves its drafting form
                quant = self.draft_quant
                self.learner = OnlineLearner(
                    self._eagle_source,
                    learn_config,
                    out=draft,
                    serve=lambda head: _drafting_form(head, quant, self.learner.current),
                    current=self.eagle,
                )
            elif self.speculator is None:
                raise InvalidParameterError(f"--learn: {draft} holds no speculator heads")
            else:
                self.learner = OnlineLearner(self.speculator, learn_config, out=draft)
        if self.tree is not None and self.speculator is None and self.eagle is None:
            raise InvalidParameterError("--tree needs speculator heads as --draft")
        tree_nodes = factory(1, 1).max_nodes if self.tree is not None else 0
        heads_model = self.speculator or self.eagle
        if heads_model is not None and isinstance(window, AdaptiveWindow):
            n = heads_model.config.n_predict  # the heads draft at most n tokens
            window = AdaptiveWindow(k_max=min(window.k_max, n))
        if max_len is not None:  # a server's fixed budget, never past the model's context
            headroom = max(window.k_max, tree_nodes) + 2
            max_len = min(max_len, self.model.config.max_position_embeddings + headroom)
        self._costs_file = None
        if isinstance(window, AdaptiveWindow) and self.tp is None and _cost_cache_on():
            setup = {
                "target": str(path), "quant": quant, "dtype": dtype, "device": str(device),
                "draft": draft, "draft_quant": draft_quant, "draft_vocab": draft_vocab,
                "tree": self.tree,
                "n_candidates": n_candidates, "max_batch": max_batch,
                "int4_layout": "measured",  # costs timed with the draft in rows by rule are stale
            }  # fmt: skip
            self._costs_file, self._costs_setup = cost_file(setup), setup
            window.costs = load_costs(self._costs_file) or window.costs
            _start_from_stored_acceptance(window, self._costs_file)
            atexit.register(_save_costs_if_alive, weakref.ref(self))
        window = shared_window(window, self.tp)  # rank 0's choice of k on every rank
        self.engine = Engine(
            self.model,
            self.tokenizer,
            self.eos_ids,
            max_batch,
            factory,
            acceptor,
            window,
            max_len=max_len,
            max_tree_nodes=tree_nodes,
            prefix_cache_tokens=prefix_cache_tokens,
            prefill_chunk=self.prefill_chunk,
            **self.engine_options,
        )
        self.prefix_cache_tokens = prefix_cache_tokens

    def footprint(self) -> dict[str, int]:
        """Resident bytes of each loaded model ("target", "draft" or "heads"): its weights in
        every format its kernels read (`footprint.resident_bytes`)."""
        from specdec.models.footprint import resident_bytes

        models = {
            "target": self.model,
            "draft": getattr(self, "draft_model", None),
            "heads": self.speculator or self.eagle,
        }
        return {name: resident_bytes(m) for name, m in models.items() if m is not None}

    def plain_engine(self) -> Engine:
        """The same target without speculation, for side-by-side comparisons."""
        return Engine(
            self.model,
            self.tokenizer,
            self.eos_ids,
            self.engine.max_batch,
            prefix_cache_tokens=self.prefix_cache_tokens,
            prefill_chunk=self.prefill_chunk,
            **self.engine_options,
        )

    def _drafter_factory(self, draft: str, dtype: str, device: str, quant: str):
        if draft == "ngram":
            return lambda max_batch, max_len: NgramDrafter()
        if is_eagle_dir(draft):
            head = load_eagle(draft, self.model, self.model.dtype, device)
            if self.learning:  # the learner trains this form: for_drafting works in place
                from specdec.speculator.online import copy_heads

                self._eagle_source, head = head, copy_heads(head, head)
            self.eagle = _drafting_form(head, quant)
            return lambda max_batch, max_len: EagleDrafter(
                self.eagle if self.learner is None else self.learner.current,
                max_batch,
                max_len,
                self.tree,
                self.n_candidates,
                learner=self.learner,
            )
        if is_speculator_dir(draft):
            # Under tensor parallelism every rank holds all the heads (they are small) and
            # drafts alike from the whole hidden state, which every rank has after the
            # target's all-reduces; heads that reuse the target's head get it whole.
            self.speculator = load_speculator(draft, self.model, self.model.dtype, device)
            if not self.learning:  # a learner trains these and serves them as they are
                self.speculator = tuned_layers(self.speculator.for_drafting(quant))
            return lambda max_batch, max_len: SpeculatorDrafter(
                self.speculator if self.learner is None else self.learner.current,
                max_batch,
                device,
                tree=self.tree,
                n_candidates=self.n_candidates,
                learner=self.learner,
                **self.engine_options,
            )
        from specdec.models.registry import gguf_source, resolve

        path = resolve(draft, dtype)
        check_same_tokenizer(self.tokenizer, load_tokenizer(path))
        # draft_tp = 1: every rank holds the whole draft and drafts on its own.
        shard = self.tp if self.draft_tp > 1 else None
        source = gguf_source(draft) if quant == "int4" and shard is None else None
        # Its layout measured in _tuned; streamed and guarded as the target is.
        draft_model = load_model(path, dtype, device, quant, source, shard, "the draft")
        vocab, tok_size = self.model.config.vocab_size, len(self.tokenizer)
        usable = min(vocab, tok_size, draft_model.config.vocab_size)
        ids = rows = None
        cut, keep = self.draft_vocab, self.eos_ids
        self.draft_head = "whole"
        if cut is None and shard is None and torch.device(device).type == "cpu":
            # By default a CPU draft scores the lowest ids and each request's own: its head
            # is 28% of the 0.5B's bytes a step, and a GPU's step is bound by its launches.
            if AUTO_DRAFT_VOCAB < usable:
                ids = lowest_ids(AUTO_DRAFT_VOCAB, usable, keep=keep)
                self.draft_head = f"the lowest {AUTO_DRAFT_VOCAB:,} ids + each request's own"
        elif cut and cut < usable:  # the most frequent ids in ShareGPT answers
            ids = frequent_ids(self.tokenizer, cut, usable, keep=keep)
            self.draft_head = f"ShareGPT's {cut:,} most frequent ids + each request's own"
        if ids is not None:  # lossless: only q changes
            rows = head_rows(draft_model.lm_head)  # and the ids of each row's context
            prune_vocab_head(draft_model, ids)
        self.draft_model = draft_model = _tuned(draft_model)
        draft_model.layer_stack = self.layer_stack
        # The factory holds this model, not the attribute: a later build (a script's second
        # draft) must not hand an engine's drafter another model than its cut was made for.
        return lambda max_batch, max_len: DraftModelDrafter(
            draft_model, vocab, tok_size, max_batch, max_len, vocab=ids,
            context_rows=rows, prefill_chunk=self.prefill_chunk, **self.engine_options,
        )  # fmt: skip

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    @reports_failures(keep=(SpecdecError,))
    def generate(
        self,
        prompts: str | Sequence[str],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool = False,
    ) -> list[Completion]:
        """Complete each prompt (wrapped in the chat template when `chat`)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        ids = [self.encode(p, chat) for p in prompts]
        out = self.engine.generate(ids, self.spmd_params(params or SamplingParams(), len(ids)))
        self.save_costs()
        return out

    def save_costs(self) -> None:
        """Store `auto`'s measured costs for the next process on this machine and set-up
        (`specdec.cost_cache`); called after each `generate` and at exit."""
        if self._costs_file is not None:
            window = self.engine.window
            save_costs(self._costs_file, window.costs, self._costs_setup, window.acceptance_state())

    def spmd_params(self, params, n: int):
        """Under tensor parallelism, rank 0's seeds for the `n` requests that have none
        (every rank must sample alike); `params` unchanged otherwise."""
        return shared_seeds(params, n, self.tp)

    def close(self) -> None:
        """Stop learning (checkpointing the heads) and leave the tensor-parallel group if
        this LLM joined it."""
        if self.learner is not None:
            self.learner.close()
        if self.tp is not None:
            self.tp.close()


def _cost_cache_on() -> bool:
    return os.environ.get("SPECDEC_COST_CACHE", "1") != "0"


def _start_from_stored_acceptance(window: AdaptiveWindow, path) -> None:
    """The last run's acceptance as the window's prior, where one is stored and valid."""
    state = load_acceptance(path)
    if state is None:
        return
    try:
        window.start_from(state)
    except (KeyError, TypeError, ValueError) as err:
        log.warning("specdec: ignoring stored acceptance in %s (%s)", path, err)


def _save_costs_if_alive(ref) -> None:
    llm = ref()
    if llm is not None:
        llm.save_costs()


def _tuned(model):
    """`model` with every CPU projection on the kernel measured fastest here, and its
    steps through the native decode stack where that was measured faster."""
    if model.device.type == "cpu":
        # Measured here, else predicted for this CPU and measured within the budget.
        tune_model(model, "a model")
    return model


def _drafting_form(head, quant: str, earlier=None):
    """An eagle head as it drafts: fused and quantized (in place), on tuned kernels;
    `earlier` (a drafting form of a head on the same target) lends its vocabulary layer."""
    vocab = None if earlier is None else earlier.vocab_head
    return tuned_layers(head.for_drafting(quant, vocab_head=vocab))


def tuned_layers(module):
    """`module`'s CPU projections on the kernels (and int4 layouts) measured fastest here:
    `_tuned` for what is not a whole Transformer (it has no decode stack)."""
    # Buffers too: an int4 layer's `weight` is a meta shape, its blocks are buffers.
    tensors = (*module.parameters(), *module.buffers())
    if next(t for t in tensors if t.device.type != "meta").device.type == "cpu":
        tune_layers(module, "a draft head")
    return module


def _new_heads_if_empty(draft: str, target, n: int) -> None:
    """`--learn` on a directory without heads: untrained ones (the target's tables, so only
    small projections and adapters learn), written there so a restart resumes."""
    from specdec.speculator.model import build_speculator

    path = Path(draft).expanduser()
    if (path / "config.json").exists():
        return
    if path.exists() and any(path.iterdir()):
        raise InvalidParameterError(f"--learn: {path} is neither heads nor an empty directory")
    build_speculator(target, n_predict=n, reuse_target=True).save(path)


def _parse_tree(tree: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """ "4,3,2" or (4, 3, 2) -> (4, 3, 2); None stays None."""
    if tree is None or isinstance(tree, tuple | list):
        return None if tree is None else tuple(int(k) for k in tree)
    try:
        return tuple(int(k) for k in str(tree).split(","))
    except ValueError:
        raise InvalidParameterError(f"tree must look like 4,3,2, got {tree!r}") from None


def build_window(speculate: int | str, k_max: int = 8) -> FixedWindow | AdaptiveWindow:
    """`--speculate K|auto` -> the window policy."""
    if not 1 <= k_max <= MAX_WINDOW:
        raise InvalidParameterError(f"k_max must be in [1, {MAX_WINDOW}], got {k_max}")
    if speculate == "auto":
        return AdaptiveWindow(k_max=k_max)
    try:
        k = int(speculate)
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"speculate must be an integer or 'auto', got {speculate!r}"
        ) from None
    if not 0 <= k <= MAX_WINDOW:
        raise InvalidParameterError(f"speculate must be in [0, {MAX_WINDOW}] or 'auto', got {k}")
    return FixedWindow(k)


def build_acceptor(spec: str | TokenAcceptor) -> TokenAcceptor:
    """A built-in acceptor name, "module:Class" or "path/to/file.py:Class" (instantiated
    without arguments), or an acceptor instance."""
    if not isinstance(spec, str):
        return spec
    if spec in ACCEPTORS:
        return ACCEPTORS[spec]()
    if ":" not in spec:
        raise InvalidParameterError(
            f"unknown acceptor {spec!r}: use one of {', '.join(ACCEPTORS)} or module:Class"
        )
    module_name, _, class_name = spec.rpartition(":")
    try:
        cls = getattr(_import(module_name), class_name)
    except (ImportError, AttributeError, OSError) as err:
        raise InvalidParameterError(f"cannot load acceptor {spec!r}: {err}") from err
    try:
        acceptor = cls()
    except TypeError as err:
        raise InvalidParameterError(
            f"cannot instantiate acceptor {spec} without arguments: {err}"
        ) from err
    if not isinstance(acceptor, TokenAcceptor):
        raise InvalidParameterError(
            f"{spec} is not a TokenAcceptor: it needs a `lossless` attribute and "
            "__call__(draft, target_probs, generators) -> Verdict"
        )
    return acceptor


def _import(module: str):
    """A module by dotted name, or from a .py file path."""
    if not module.endswith(".py"):
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(Path(module).stem, module)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {module}")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
