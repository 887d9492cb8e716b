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
from specdec.devices import check_device
from specdec.distributed import (
    check_tp_split,
    init_tensor_parallel,
    reports_failures,
    shared_seeds,
    shared_window,
)
from specdec.distributed.sharding import load_shard
from specdec.drafters import DraftModelDrafter, EagleDrafter, NgramDrafter, SpeculatorDrafter
from specdec.drafters.draft_model import check_same_tokenizer
from specdec.drafters.draft_vocab import (
    AUTO_DRAFT_VOCAB,
    frequent_ids,
    head_rows,
    lowest_ids,
    prune_vocab_head,
)
from specdec.drafters.kinds import DraftSpec
from specdec.drafters.suffix import SuffixStore, suffix_factory
from specdec.engine import Completion, Engine
from specdec.engine_args import MAX_WINDOW, EngineArgs, parse_speculate
from specdec.errors import InvalidParameterError, SpecdecError
from specdec.graphs.static_pass import use_static_passes
from specdec.heads.eagle import load_eagle
from specdec.heads.mlp import load_speculator
from specdec.kernels.first_load import prepare_cpu, tune_layers, tune_model
from specdec.kernels.quantize import quantize
from specdec.models.quant_load import load_model
from specdec.models.transformer import Transformer
from specdec.params import SamplingParams
from specdec.prefill import resolve_prefill_chunk
from specdec.tokenization import (
    encode_prompt,
    eos_token_ids,
    load_tokenizer,
    same_tokenizer_files,
)
from specdec.window import AdaptiveWindow, FixedWindow
from specdec.window.cache import cost_file, load_acceptance, load_costs, save_costs

log = logging.getLogger(__name__)


class LLM:
    """A loaded target model plus its tokenizer and, optionally, a drafter.

    draft: None (plain decoding), "ngram" (prompt lookup), "suffix" (suffix decoding: the
        longest matching suffix in this request or a past one's prompt and output,
        `specdec.drafters.suffix`; `suffix_tokens` of past requests kept, default 65,536),
        a model name / path sharing
        the target's tokenizer, or a directory of speculator heads trained for this target
        (`specdec train-speculator`; their config.json says "mlp_speculator"), or of an
        eagle head (one layer over the target's states; "specdec_eagle"). "suffix+model:NAME"
        (or suffix+heads:DIR, ...) combines suffix decoding with that drafter, each row
        drafting from whichever expects more accepted (`specdec.drafters.hybrid`).
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
    row count (`specdec.kernels.tuning`; timed once per machine, then cached).
    tp: tensor-parallel ranks for the target, launched by `torchrun --nproc-per-node tp`;
        every rank builds the same LLM and calls `generate` with the same prompts.
    draft_tp: 1 (default: every rank runs the whole draft model, no communication) or
        `tp` (the draft is sharded like the target).
    tree: with speculator or eagle heads, the top-k per draft position ("4,3,2"): each step
        drafts a candidate tree of the best `n_candidates` paths (default: all), verified
        in one target pass (`specdec.heads.tree`); lossless with the rejection and
        greedy acceptors.
    learn: with speculator heads (or an eagle head), train them on the requests this LLM
        answers while it serves (`specdec.training.online`), checkpointing into the
        heads directory; a directory without heads starts untrained ones (`learn_heads` of
        them, reusing the target's tables). `learn_config` (a LearnConfig) sets the budget
        and sizes; `learner` then holds the trainer and its metrics. Output stays lossless.
    cuda_graphs: on a CUDA device (default on), the target's decode and verify passes,
        the draft model's steps and the heads' drafting run as CUDA graphs captured per
        bucket of (rows, tokens per row) (`specdec.graphs.static_pass`); False is the
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
        is `prefill.PREFILL_CHUNK_CPU` on a CPU and one pass on a GPU; 0 is one pass.
    """

    @reports_failures()  # tensor parallelism: a rank that cannot load must not hang the others
    def __init__(self, model: str | EngineArgs, **options) -> None:
        """`LLM(model, **options)` with the fields of `EngineArgs` as options, or
        `LLM(EngineArgs(...))`."""
        args = model if isinstance(model, EngineArgs) else EngineArgs(model=model, **options)
        self.args = args
        spec, device, dtype = args.draft_spec, args.device, args.dtype
        check_device(device)  # a CPU-only torch or a missing GPU: one line, before any load
        self.prefill_chunk = resolve_prefill_chunk(args.prefill_chunk, device)  # before any load
        self.tp = init_tensor_parallel(args.tp, device)  # None for tp = 1; checks WORLD_SIZE
        self.draft_tp = args.draft_tp
        self.draft_vocab = args.draft_vocab
        self.draft_head = None  # what a draft model's vocabulary head scores, in words
        static, graphs = use_static_passes(torch.device(device), None, args.cuda_graphs)
        # Engine and drafter options, shared by every engine built on this LLM.
        self.engine_options = {
            "static_passes": static and self.tp is None,
            "cuda_graphs": graphs and self.tp is None,
        }
        window = build_window(args.window, args.k_max)
        acceptor = build_acceptor(args.acceptor)
        device = self._load_target(device)
        draft_quant = args.draft_quant
        if draft_quant is None:
            draft_quant = "int4" if torch.device(device).type == "cpu" else "none"
        self.draft_quant = draft_quant
        self.speculator = self.learner = self.eagle = self.suffix_store = None
        self.learning = args.learn
        self.tree = args.tree
        self.n_candidates = args.n_candidates
        if args.learn:
            _new_heads_if_empty(spec.value, self.model, args.learn_heads)
        factory = self._drafter_factory(spec, dtype, device, draft_quant) if spec else None
        if args.learn:
            self.learner = self._learner(spec)
        tree_nodes = factory(1, 1).max_nodes if self.tree is not None else 0
        heads_model = self.speculator or self.eagle
        if heads_model is not None and isinstance(window, AdaptiveWindow):
            n = heads_model.config.n_predict  # the heads draft at most n tokens
            window = AdaptiveWindow(k_max=min(window.k_max, n))
        max_len = args.max_len
        if max_len is not None:  # a server's fixed budget, never past the model's context
            headroom = max(window.k_max, tree_nodes) + 2
            max_len = min(max_len, self.model.config.max_position_embeddings + headroom)
        self._costs_file = None
        if isinstance(window, AdaptiveWindow) and self.tp is None and _cost_cache_on():
            self._warm_start(window, device)
        window = shared_window(window, self.tp)  # rank 0's choice of k on every rank
        self.engine = Engine(
            self.model,
            self.tokenizer,
            self.eos_ids,
            args.max_batch,
            factory,
            acceptor,
            window,
            max_len=max_len,
            max_tree_nodes=tree_nodes,
            prefix_cache_tokens=args.prefix_cache_tokens,
            prefill_chunk=self.prefill_chunk,
            **self.engine_options,
        )
        self.prefix_cache_tokens = args.prefix_cache_tokens

    def _load_target(self, device: str) -> str:
        """Tokenizer and target model of `self.args` (streamed into its quantized layers,
        refused up front where it would not fit); returns the device it is on (a rank's
        own under tensor parallelism)."""
        from specdec.hub import gguf_source, resolve

        args, dtype = self.args, self.args.dtype
        path = resolve(args.model, dtype)
        self.name, self.path = args.model, path
        self.tokenizer = load_tokenizer(path)
        self.eos_ids = eos_token_ids(path, self.tokenizer)
        if self.tp is not None:  # each rank on its own device; refuse bad splits before loading
            device = self.tp.device
            draft = args.draft_spec.value if args.draft_tp > 1 else None
            check_tp_split(path, draft, dtype, args.tp)
        # int4 from a Q4_K GGUF runs the file's own 4-bit blocks (a shard re-quantizes).
        quant = self.quant = args.quant
        source = gguf_source(args.model) if quant == "int4" and self.tp is None else None
        if torch.device(device).type == "cpu":
            prepare_cpu()  # native builds; pack once, in the layout this machine timed
        self.model = _tuned(_load_model(path, dtype, device, self.tp, quant, source, "the target"))
        self.layer_stack = None if args.fused_layers else "eager"  # raced at the first capture
        self.model.layer_stack = self.layer_stack
        return device

    def _warm_start(self, window: AdaptiveWindow, device: str) -> None:
        """`auto` starts from the costs and acceptance stored for this exact setup (target,
        formats, drafter, batch), and stores its own at exit."""
        args = self.args
        setup = {
            "target": str(self.path), "quant": self.quant, "dtype": args.dtype,
            "device": str(device), "draft": args.draft, "draft_quant": self.draft_quant,
            "draft_vocab": args.draft_vocab, "tree": self.tree,
            "n_candidates": args.n_candidates, "max_batch": args.max_batch,
            "int4_layout": "measured",  # costs timed with the draft in rows by rule are stale
        }  # fmt: skip
        self._costs_file, self._costs_setup = cost_file(setup), setup
        window.costs = load_costs(self._costs_file) or window.costs
        _start_from_stored_acceptance(window, self._costs_file)
        atexit.register(_save_costs_if_alive, weakref.ref(self))

    def _learner(self, spec: DraftSpec):
        """The online learner of the heads `spec` names (`--learn`)."""
        from specdec.training.online import LearnConfig, OnlineLearner

        args = self.args
        config = args.learn_config or LearnConfig(
            budget=args.learn_budget, lr=args.learn_lr, replay_share=args.learn_replay
        )
        if spec.kind == "eagle3":  # drafts with the form it trains
            return OnlineLearner(self.eagle, config, out=spec.value)
        if self.eagle is not None:  # trains the loaded head, serves its drafting form
            quant = self.draft_quant
            return OnlineLearner(
                self._eagle_source,
                config,
                out=spec.value,
                serve=lambda head: _drafting_form(head, quant, self.learner.current),
                current=self.eagle,
            )
        if self.speculator is None:
            raise InvalidParameterError(f"--learn: {spec.value} holds no speculator heads")
        return OnlineLearner(self.speculator, config, out=spec.value)

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

    def _drafter_factory(self, spec: DraftSpec, dtype: str, device: str, quant: str):
        """`(max_batch, max_len) -> Drafter` for the kind `spec` names (dispatched once)."""
        build = {
            "ngram": self._ngram_drafter,
            "suffix": self._suffix_drafter,
            "model": self._draft_model_drafter,
            "heads": self._heads_drafter,
            "eagle": self._eagle_drafter,
            "eagle3": self._eagle3_drafter,
        }[spec.kind]
        factory = build(spec.value, dtype, device, quant)
        if spec.with_suffix:  # suffix+KIND: each row drafts from whichever expects more
            from specdec.drafters.hybrid import hybrid_factory

            factory = hybrid_factory(self._suffix_drafter(None, dtype, device, quant), factory)
        return factory

    def _ngram_drafter(self, value, dtype: str, device: str, quant: str):
        return lambda max_batch, max_len: NgramDrafter()

    def _suffix_drafter(self, value, dtype: str, device: str, quant: str):
        # Past requests' tokens, shared by every drafter this LLM builds.
        self.suffix_store = SuffixStore(self.args.suffix_tokens)
        return suffix_factory(self.suffix_store)

    def _eagle_drafter(self, draft: str, dtype: str, device: str, quant: str):
        head = load_eagle(draft, self.model, self.model.dtype, device)
        if self.learning:  # the learner trains this form: for_drafting works in place
            from specdec.training.online import copy_heads

            self._eagle_source, head = head, copy_heads(head, head)
        self.eagle = _drafting_form(head, quant)
        return self._eagle_factory(EagleDrafter)

    def _eagle3_drafter(self, draft: str, dtype: str, device: str, quant: str):
        """An EAGLE-3 head (vLLM's layout) drafting from the target's layer inputs, which
        the eager passes hand over (the engine runs no fixed-shape ones with this head)."""
        from specdec.drafters.eagle3 import Eagle3Drafter
        from specdec.heads.eagle3 import load_eagle3

        head = load_eagle3(draft, self.model, self.model.dtype, device)
        # the learner trains the form it drafts with; otherwise the drafting form
        self.eagle = head if self.learning else tuned_layers(head.for_drafting(quant))
        return self._eagle_factory(Eagle3Drafter)

    def _eagle_factory(self, drafter_class):
        """`(max_batch, max_len) -> drafter` of an eagle or EAGLE-3 head: the loaded one,
        or with `--learn` the learner's newest."""
        return lambda max_batch, max_len: drafter_class(
            self.eagle if self.learner is None else self.learner.current,
            max_batch,
            max_len,
            self.tree,
            self.n_candidates,
            learner=self.learner,
        )

    def _heads_drafter(self, draft: str, dtype: str, device: str, quant: str):
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

    def _draft_model_drafter(self, draft: str, dtype: str, device: str, quant: str):
        from specdec.hub import gguf_source, resolve

        path = resolve(draft, dtype)
        if not same_tokenizer_files(path, self.path):
            check_same_tokenizer(self.tokenizer, load_tokenizer(path))
        # draft_tp = 1: every rank holds the whole draft and drafts on its own.
        shard = self.tp if self.draft_tp > 1 else None
        source = gguf_source(draft) if quant == "int4" and shard is None else None
        # Its layout measured in _tuned; streamed and guarded as the target is.
        draft_model = _load_model(path, dtype, device, shard, quant, source, "the draft")
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
        (`specdec.window.cache`); called after each `generate` and at exit."""
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
    from specdec.heads.mlp import build_speculator

    path = Path(draft).expanduser()
    if (path / "config.json").exists():
        return
    if path.exists() and any(path.iterdir()):
        raise InvalidParameterError(f"--learn: {path} is neither heads nor an empty directory")
    build_speculator(target, n_predict=n, reuse_target=True).save(path)


def build_window(speculate: int | str, k_max: int = 8) -> FixedWindow | AdaptiveWindow:
    """`--speculate K|auto` -> the window policy."""
    speculate = parse_speculate(speculate)
    if not 1 <= k_max <= MAX_WINDOW:
        raise InvalidParameterError(f"k_max must be in [1, {MAX_WINDOW}], got {k_max}")
    return AdaptiveWindow(k_max=k_max) if speculate == "auto" else FixedWindow(speculate)


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


def _load_model(path, dtype: str, device: str, tp, quant: str, source, what: str) -> Transformer:
    """The whole model on `device`, streamed into its `quant` layers and refused up front
    where it would not fit; with `tp`, this rank's tensor-parallel shard, quantized after."""
    if tp is None:
        return load_model(path, dtype, device, quant, source, what)
    return quantize(load_shard(path, dtype, tp), quant, source)
