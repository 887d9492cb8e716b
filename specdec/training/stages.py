"""The two-stage speculator trainer (Wertheimer et al. 2024, section 4).

Stage 1 (ground truth): documents are packed into rows `x [B, T]`; the frozen target gives
its final-normed states `h [B, T, E]` in one pass; head i at position t learns token
x_{t+i+2} from h_t and the true tokens x_{t+1} .. x_{t+i+1} (teacher forcing). With
`stage1_labels="target"` the label is instead the target's own greedy choice after
x_{<=t+i+1} (`target_labels`, one product of the states with its vocabulary head): the
token greedy verification would keep, stage 2's label without generating anything.

Stage 2 (the target's own outputs): the target continues prompts from the data in batches
(specdec's Engine, `stage2_temperature`); one more target pass over prompt + continuation
gives the states, and the heads learn the continuation tokens from them. Continuations and
their states are cached under `out/stage2/` (generating is the expensive part), and the
stage cycles over that pool.

After each stage the heads are evaluated on held-out prompts (never trained on) against the
target's greedy continuations: per-head acceptance (head i right given heads 0..i-1 right,
what greedy verification keeps), top-1 accuracy, and the mean accepted length (tokens per
target pass with a window of n), plus the same figure measured by running the engine with
the SpeculatorDrafter.

Checkpoints (`out/checkpoint/`: heads, optimizer, stage, step and data position) are written
every `checkpoint_every` steps; a run started again with the same `out` resumes there.
Python API: `train_speculator(...)` or `SpeculatorTrainer(...).run()`.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec.errors import InvalidParameterError
from specdec.heads.eagle import EagleHead, build_eagle, load_eagle
from specdec.heads.eagle3 import (
    Eagle3Head,
    build_eagle3,
    check_aux_layers,
    check_distinct_layers,
    default_aux_layers,
    load_eagle3,
)
from specdec.heads.mlp import MLPSpeculator, build_speculator, load_speculator
from specdec.params import SamplingParams
from specdec.training.corpus import (
    Corpus,
    PackedStream,
    document_order,
    load_records,
    most_frequent_ids,
)
from specdec.training.losses import eagle3_losses, eagle_losses, head_losses
from specdec.training.segments import STAGE2, pad_segments, save_stage2_segments, stage2_segments
from specdec.training.target import (
    TargetStates,
    Throughput,
    heads_autocast,
    si,
    target_dtype,
    target_labels,
)

STAGE1_LABELS = ("text", "target")
# MLP heads (`model`), one decoder layer over the final states (`eagle`), or EAGLE-3's layer
# over three layers' inputs, in vLLM's layout (`eagle3`)
KINDS = ("mlp", "eagle", "eagle3")
# Peak learning rates (stage 1, stage 2) by kind. An EAGLE-3 head's fc reads the target's
# raw layer inputs, whose attention-sink rows reach thousands: at 1e-3 it made no progress in
# 60 steps on the Qwen 1.5B (10.5 nats a token, uniform is 10.4); at 3e-4 it learns.
PEAK_LR = {"mlp": (1e-3, 3e-4), "eagle": (1e-3, 3e-4), "eagle3": (3e-4, 1e-4)}


@dataclass(frozen=True)
class TrainConfig:
    heads: int = 3  # n_predict: tokens proposed per step (eagle: draft steps trained)
    kind: str = "mlp"  # "mlp" heads or an "eagle" head (`specdec.heads.eagle`)
    eagle_intermediate: int | None = None  # the eagle layer's MLP width (None: the target's)
    eagle_cls_weight: float = 0.1  # eagle loss: state regression + this x cross-entropy
    # eagle3: the target layers whose inputs the head reads (None: vLLM's (2, L//2, L-3))
    eagle3_layers: tuple[int, ...] | None = None
    stage1_steps: int = 1000  # teacher-forced steps on ground-truth text
    # Steps of fresh text (None: all of them). Their target states are cached on disk and
    # later stage-1 steps cycle over them: a heads-only step costs a small fraction of the
    # target pass, so on a slow machine epochs over cached states buy far more training.
    stage1_data_steps: int | None = None
    # What the stage-1 heads learn to predict: "text", the next tokens of the text, or
    # "target", the target's own greedy choice after each prefix of it (`target_labels`).
    stage1_labels: str = "text"
    stage2_steps: int = 500  # steps on the target's own continuations
    batch_size: int = 8  # rows per step
    seq_len: int = 256  # tokens per stage-1 row
    lr: float | None = None  # peak learning rate (AdamW), stage 1 (None: PEAK_LR[kind])
    stage2_lr: float | None = None  # peak learning rate, stage 2 (None: PEAK_LR[kind])
    warmup: float = 0.05  # fraction of a stage's steps with a linear warm-up (then cosine)
    checkpoint_every: int = 100  # steps between checkpoints
    log_every: int = 10  # steps between log lines (train_log.jsonl)
    reuse_target: bool = True  # heads use the target's frozen embeddings and lm_head
    tie_weights: bool = False
    inner_dim: int | None = None  # head width when not reusing the target's tables
    draft_vocab: int = 0  # > 0: heads score only this many most frequent ids
    stage2_prompts: int | None = None  # continuations to generate (None: ~4 uses each)
    stage2_max_tokens: int = 128  # tokens per continuation
    stage2_temperature: float = 0.0  # 0 = the target's greedy outputs
    gen_batch: int = 8  # continuations generated together
    max_prompt_tokens: int = 512  # longer prompts are skipped in stage 2 and evaluation
    eval_prompts: int = 16  # held-out prompts for evaluation (never trained on)
    eval_max_tokens: int = 64
    chat: bool = True  # conversations through the tokenizer's chat template when it has one
    seed: int = 0
    progress: bool = True  # tqdm bars
    # The heads' forward and backward under bf16 autocast (weights and optimizer stay fp32);
    # None: where the device multiplies bf16 natively (`heads_autocast`).
    heads_autocast: bool | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise InvalidParameterError(message)

        check(self.heads >= 1, f"heads must be >= 1, got {self.heads}")
        check(self.kind in KINDS, f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name, default in zip(("lr", "stage2_lr"), PEAK_LR[self.kind], strict=True):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
            check(getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
        check(self.stage1_steps >= 0 and self.stage2_steps >= 0, "steps must be >= 0")
        check(self.batch_size >= 1, "batch_size must be >= 1")
        check(
            self.stage1_data_steps is None or self.stage1_data_steps >= 1,
            f"stage1_data_steps must be >= 1, got {self.stage1_data_steps}",
        )
        check(
            self.stage1_labels in STAGE1_LABELS,
            f"stage1_labels must be one of {', '.join(STAGE1_LABELS)}, got {self.stage1_labels!r}",
        )
        check(self.seq_len >= self.heads + 3, f"seq_len must be >= heads + 3 = {self.heads + 3}")
        check(self.checkpoint_every >= 1 and self.log_every >= 1, "intervals must be >= 1")
        check(self.stage2_max_tokens >= self.heads + 1, "stage2_max_tokens must exceed heads")
        check(self.eval_max_tokens >= self.heads + 1, "eval_max_tokens must exceed heads")
        check(
            self.kind != "eagle3" or self.stage1_labels == "text",
            "an eagle3 head learns stage 1 from the text (--stage1-labels text); stage 2 "
            "teaches it the target's own choices",
        )
        check(
            self.eagle3_layers is None or (self.kind == "eagle3" and len(self.eagle3_layers) == 3),
            "eagle3_layers: three layer ids, with kind eagle3",
        )
        if self.eagle3_layers is not None:
            check_distinct_layers(tuple(self.eagle3_layers))

    @property
    def pool_size(self) -> int:
        if self.stage2_prompts is not None:
            return self.stage2_prompts
        return max(self.gen_batch, math.ceil(self.stage2_steps * self.batch_size / 4))


def walked_windows(run: torch.Tensor) -> tuple[int, int]:
    """(tokens, passes) of the engine's own walk over a segment: `run [L, n]` says, per
    start position, whether drafts 0..i of a chain from there were all right. The first
    window starts at 0 and each next one where the last ended (1 + its kept drafts on).

    Why not the mean over every start position: the engine crosses an easy stretch of m
    tokens in about m / (n + 1) passes but a hard one in m, so tokens per pass is a mean
    over passes; the mean over positions counts each easy position once per token and
    reads higher (a segment half easy, half hard: 1 + n / 2 against (2n + 2) / (n + 2))."""
    kept = run.sum(1).tolist()  # drafts kept by a window from each position
    tokens = passes = t = 0
    while t < len(kept):
        tokens += 1 + kept[t]
        passes += 1
        t += 1 + kept[t]
    return tokens, passes


def lr_at(step: int, total: int, peak: float, warmup: float) -> float:
    """Linear warm-up over `warmup * total` steps, then cosine decay to 10% of the peak."""
    w = max(1, int(warmup * total))
    if step < w:
        return peak * (step + 1) / w
    frac = (step - w) / max(1, total - w)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


# --- the trainer ---


class SpeculatorTrainer:
    """Train speculator heads for `target` (a native Transformer) on `corpus` into `out`."""

    def __init__(
        self,
        target,
        tokenizer,
        corpus: Corpus,
        out: str | Path,
        cfg: TrainConfig,
        eos_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.target = target.eval().requires_grad_(False)
        self.tokenizer, self.corpus, self.cfg = tokenizer, corpus, cfg
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.eos_ids = eos_ids
        # The states the heads read: for eagle3 the inputs of its layers, else the final ones.
        self.aux_layers: tuple[int, ...] = ()
        if cfg.kind == "eagle3":
            layers = cfg.eagle3_layers or default_aux_layers(target.config.num_layers)
            check_aux_layers(tuple(layers), target.config.num_layers)
            self.aux_layers = tuple(layers)
        self.throughput = Throughput()
        self.states = TargetStates(target, self.throughput, self.aux_layers)
        order = document_order(len(corpus), cfg.seed)
        n_eval = min(cfg.eval_prompts, max(0, len(order) - 1))
        self.eval_docs, self.train_docs = order[:n_eval], order[n_eval:]
        self.device = target.device
        self.autocast = heads_autocast(self.device.type, cfg.heads_autocast)
        self.log_file = self.out / "train_log.jsonl"

    # checkpoints -----------------------------------------------------------------

    @property
    def ckpt(self) -> Path:
        return self.out / "checkpoint"

    def save_checkpoint(self, spec, opt, stage: int, step: int, data) -> None:
        tmp = self.out / "checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        spec.save(tmp / "speculator")
        torch.save(spec.state_dict(), tmp / "weights.pt")  # bit-exact, for resuming
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
        state = {"stage": stage, "step": step, "data": data, "config": asdict(self.cfg)}
        (tmp / "state.json").write_text(json.dumps(state))
        shutil.rmtree(self.ckpt, ignore_errors=True)
        tmp.rename(self.ckpt)

    def load_checkpoint(self) -> tuple[MLPSpeculator, dict] | None:
        if not (self.ckpt / "state.json").is_file():
            return None
        state = json.loads((self.ckpt / "state.json").read_text())
        load = {"eagle": load_eagle, "eagle3": load_eagle3}.get(self.cfg.kind, load_speculator)
        spec = load(self.ckpt / "speculator", self.target, torch.float32, self.device)
        weights = torch.load(self.ckpt / "weights.pt", weights_only=True, map_location=self.device)
        spec.load_state_dict(weights)
        return spec.train().requires_grad_(True), state

    def new_speculator(self) -> MLPSpeculator:
        cfg = self.cfg
        vocab = self.frequent_ids(cfg.draft_vocab) if cfg.draft_vocab else None
        with torch.random.fork_rng():  # a seeded init that leaves the global RNG as it was
            torch.manual_seed(cfg.seed)
            if cfg.kind == "eagle":
                spec = build_eagle(self.target, vocab, cfg.eagle_intermediate, cfg.heads)
                return spec.to(self.device).train()
            if cfg.kind == "eagle3":
                spec = build_eagle3(
                    self.target, vocab, cfg.eagle_intermediate, cfg.heads, self.aux_layers
                )
                return spec.to(self.device).train()
            spec = build_speculator(
                self.target,
                n_predict=cfg.heads,
                inner_dim=cfg.inner_dim,
                tie_weights=cfg.tie_weights,
                reuse_target=cfg.reuse_target,
                draft_vocab=vocab,
            )
        return spec.to(self.device).train()

    def frequent_ids(self, n: int, docs: int = 2000) -> torch.Tensor:
        """The n most frequent target ids over (up to) `docs` training documents."""
        return most_frequent_ids(
            self.corpus, self.train_docs[:docs], n, self.target.config.vocab_size
        )

    # the run -----------------------------------------------------------------------

    def run(self) -> MLPSpeculator:
        """Both stages (resuming from a checkpoint), evaluations, and the final files."""
        resumed = self.load_checkpoint()
        spec, state = resumed if resumed else (self.new_speculator(), None)
        stage = state["stage"] if state else 1
        results = self._read_eval()
        if stage == 2 and self.cfg.stage1_steps and "stage1" not in results:
            results["stage1"] = self.evaluate(spec)  # interrupted before its evaluation
            self._write_eval(results)
        if stage == 1:
            self.stage1(spec, state)
            results["stage1"] = self.evaluate(spec)
            self._write_eval(results)
            self._log({"event": "eval", "stage": 1, **results["stage1"]})
            state = None
        if self.cfg.stage2_steps:
            self.stage2(spec, state)
            results["stage2"] = self.evaluate(spec)
            self._write_eval(results)
            self._log({"event": "eval", "stage": 2, **results["stage2"]})
        spec.save(self.out)
        return spec

    def _optimizer(self, spec, lr: float, state: dict | None):
        opt = torch.optim.AdamW(spec.trainable, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        if state is not None:
            opt.load_state_dict(torch.load(self.ckpt / "optimizer.pt", weights_only=True))
        return opt

    def _train(self, spec, stage: int, steps: int, peak: float, state, next_batch, position):
        """The loop shared by both stages: `next_batch(step)` -> (hidden, tokens, valid,
        labels)."""
        opt = self._optimizer(spec, peak, state)
        start = state["step"] if state else 0
        bar = _progress(self.cfg.progress, steps, start, f"stage {stage}")
        t0, seen = time.perf_counter(), 0
        for step in range(start, steps):
            # The target's time is counted inside; labels None: the tokens themselves.
            hidden, tokens, valid, labels = next_batch(step)
            heads_started = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, peak, self.cfg.warmup)
            with torch.autocast(self.device.type, torch.bfloat16, enabled=self.autocast):
                loss, m = self._losses(spec, hidden, tokens, valid, labels, stage, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(spec.trainable, 1.0)
            opt.step()
            self.throughput.add("heads", m.tokens, time.perf_counter() - heads_started)
            seen += m.tokens
            done = step + 1
            if bar is not None:
                bar.update(1)
                acc = "/".join(f"{a:.2f}" for a in m.acc_per_head)
                # positions trained per wall second (the target's passes included)
                pos = f"{si(seen / max(1e-9, time.perf_counter() - t0))}/s"
                bar.set_postfix(
                    loss=f"{m.loss:.3f}", acc=acc, positions=pos, **self.throughput.postfix()
                )
            if done % self.cfg.log_every == 0 or done == steps:
                rate = seen / max(1e-9, time.perf_counter() - t0)
                self._log(
                    {
                        "stage": stage,
                        "step": done,
                        "lr": group["lr"],
                        **asdict(m),
                        "tokens_per_s": round(rate, 1),  # positions per wall second, overall
                        **self.throughput.log(),
                    }
                )
            if done % self.cfg.checkpoint_every == 0 or done == steps:
                self.save_checkpoint(spec, opt, stage, done, position())
        if bar is not None:
            bar.close()

    def _losses(self, spec, hidden, tokens, valid, labels, stage: int, step: int):
        """The step's loss and metrics; an eagle head's input noise is seeded by the run's
        seed, stage and step, so a resumed run draws what an uncut one would."""
        cfg = self.cfg
        if isinstance(spec, Eagle3Head):
            return eagle3_losses(spec, hidden, tokens, valid, labels, cfg.heads)
        if not isinstance(spec, EagleHead):
            return head_losses(spec, hidden, tokens, valid, labels)
        noise = torch.Generator(hidden.device)
        noise.manual_seed(cfg.seed * 1_000_003 + stage * 100_003 + step)
        return eagle_losses(
            spec, hidden, tokens, valid, labels, cfg.heads, cfg.eagle_cls_weight, noise
        )

    def stage1(self, spec, state: dict | None) -> None:
        cfg = self.cfg
        sep = self.tokenizer.eos_token_id
        stream = PackedStream(self.corpus, self.train_docs, cfg.batch_size, cfg.seq_len, sep)
        if state is not None:
            stream.restore(state["data"])

        fresh = cfg.stage1_data_steps or cfg.stage1_steps
        cache = self.out / "stage1" if fresh < cfg.stage1_steps else None

        def next_batch(step: int):
            tokens, hidden, labels = self._stage1_batch(stream, step, fresh, cache)
            return hidden, tokens, torch.ones_like(tokens, dtype=torch.bool), labels

        self._train(spec, 1, cfg.stage1_steps, cfg.lr, state, next_batch, lambda: stream.position)
        # Stage 2 starts from these heads with a fresh optimizer.
        self.save_checkpoint(spec, self._optimizer(spec, cfg.stage2_lr, None), 2, 0, 0)

    def _stage1_batch(self, stream: PackedStream, step: int, fresh: int, cache: Path | None):
        """Tokens `[B, T]`, the target's states `[B, T, E]` and the labels `[B, T]` (None:
        the tokens themselves) of stage-1 `step`, which uses fresh-text batch `step % fresh`:
        from `cache` when stored there (an earlier epoch, or a run cut after its
        checkpoint), else the next rows of the stream (stored there when caching, with
        the target's labels: a cached epoch then costs no target product at all). A
        fresh-text step moves the stream on even when its batch is cached, so the stream
        stays where a resumed checkpoint put it."""
        from safetensors.torch import load_file, save_file

        file = None if cache is None else cache / f"batch-{step % fresh:06d}.safetensors"
        cached = file is not None and file.is_file()
        tokens = stream.next_batch() if step < fresh or not cached else None  # [B, T]
        if cached:
            saved = {k: v.to(self.device) for k, v in load_file(str(file)).items()}
            tokens, hidden = saved["tokens"], saved["hidden"]
            labels = saved.get("labels")
            if labels is None:  # cached by a run that learnt the text
                labels = self._stage1_labels(tokens, hidden)
            return tokens, hidden, labels
        tokens = tokens.to(self.device)
        hidden = self.states(tokens)  # [B, T, E]
        labels = self._stage1_labels(tokens, hidden)
        if file is not None:
            cache.mkdir(parents=True, exist_ok=True)
            tmp = file.with_suffix(".tmp")
            tensors = {"tokens": tokens.cpu(), "hidden": hidden.cpu().contiguous()}
            if labels is not None:
                tensors["labels"] = labels.cpu()
            save_file(tensors, str(tmp))
            tmp.rename(file)
        return tokens, hidden, labels

    def _stage1_labels(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """What stage 1 predicts: None for the text, else the target's choices, timed as
        target time (its positions were counted with the states)."""
        if self.cfg.stage1_labels == "text":
            return None
        started = time.perf_counter()
        labels = target_labels(self.target, hidden, tokens)  # [B, T]
        self.throughput.add("target", 0, time.perf_counter() - started)
        return labels

    def stage2(self, spec, state: dict | None) -> None:
        cfg = self.cfg
        pool = self.continuations(
            self.out / STAGE2,
            self.train_docs,
            cfg.pool_size,
            cfg.stage2_max_tokens,
            cfg.stage2_temperature,
            "stage 2 data",
        )
        if state is not None and state.get("stage") != 2:
            state = None
        if state is not None and state["step"] == 0:
            state = None  # fresh optimizer at the start of stage 2

        def next_batch(step: int):
            epoch, index = divmod(step * cfg.batch_size, len(pool))
            perm = list(range(len(pool)))
            random.Random(cfg.seed * 1000 + epoch).shuffle(perm)
            picked = [pool[perm[(index + j) % len(pool)]] for j in range(cfg.batch_size)]
            return (*pad_segments(picked, cfg.heads + 2, self.device), None)

        self._train(spec, 2, cfg.stage2_steps, cfg.stage2_lr, state, next_batch, lambda: 0)

    # continuations with their states, cached ---------------------------------------

    def continuations(
        self,
        where: Path,
        docs: list[int],
        count: int,
        max_tokens: int,
        temperature: float,
        label: str,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`count` (segment tokens [S], target states [S, E]) pairs: the last prompt token
        and the target's continuation, generated in batches and cached in `where`."""
        from specdec.engine import Engine
        from specdec.models.transformer import right_pad

        where.mkdir(parents=True, exist_ok=True)
        prompts = []
        for i in docs:
            ids = self.corpus.prompt_ids(i)
            if 1 <= len(ids) <= self.cfg.max_prompt_tokens:
                prompts.append(ids)
            if len(prompts) == count:
                break
        if not prompts:
            raise InvalidParameterError("no prompt of the data fits max_prompt_tokens")
        engine = Engine(self.target, self.tokenizer, self.eos_ids, max_batch=self.cfg.gen_batch)
        pool: list[tuple[torch.Tensor, torch.Tensor]] = []
        chunks = range(0, len(prompts), self.cfg.gen_batch)
        bar = _progress(self.cfg.progress, len(chunks), 0, label)
        for c, first in enumerate(chunks):
            file = where / f"chunk-{c:05d}.safetensors"
            if not file.is_file():  # generate, then one pass for the states
                batch = prompts[first : first + self.cfg.gen_batch]
                params = [
                    SamplingParams(
                        temperature=temperature,
                        max_tokens=max_tokens,
                        seed=self.cfg.seed + first + j,
                    )
                    for j in range(len(batch))
                ]
                started = time.perf_counter()
                outs = engine.generate(batch, params)
                seqs = [p + o.token_ids for p, o in zip(batch, outs, strict=True)]
                # Generation is target time spent on these segments; their tokens are
                # counted once, by the state pass below.
                self.throughput.add("target", 0, time.perf_counter() - started)
                padded, lengths = right_pad(seqs)
                hidden = self.states(padded, lengths)  # [b, S, E]
                segments = [
                    (torch.tensor(seq[len(p) - 1 :]), hidden[j, len(p) - 1 : len(seq)])
                    for j, (p, seq) in enumerate(zip(batch, seqs, strict=True))
                ]
                save_stage2_segments(file, segments)
            pool.extend(stage2_segments(file))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(target=self.throughput.postfix()["target"])
        if bar is not None:
            bar.close()
        return pool

    # evaluation ---------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, spec: MLPSpeculator) -> dict:
        """Per-head acceptance on the target's greedy continuations of held-out prompts."""
        cfg, n = self.cfg, spec.config.n_predict
        if not self.eval_docs:
            return {}
        pool = self.continuations(
            self.out / "eval",
            self.eval_docs,
            len(self.eval_docs),
            cfg.eval_max_tokens,
            0.0,
            "eval data",
        )
        was_training = spec.training
        spec.eval()
        reached, kept = [0] * n, [0] * n
        correct, tried = [0] * n, [0] * n
        accepted_total, positions = 0, 0
        walked_tokens = walked_passes = 0
        for tokens, hidden in pool:
            S = len(tokens)
            L = S - n - 1
            if L <= 0:
                continue
            right = self._drafts_right(spec, tokens, hidden.to(self.device), n, L)  # [L, n]
            run = right.long().cumprod(1)  # [L, n]: heads 0..i all right
            for i in range(n):
                prior = run[:, i - 1] if i else torch.ones(L, dtype=torch.long)
                reached[i] += int(prior.sum())
                kept[i] += int(run[:, i].sum())
                correct[i] += int(right[:, i].sum())
                tried[i] += L
            accepted_total += int(run.sum())
            positions += L
            walked = walked_windows(run)
            walked_tokens, walked_passes = walked_tokens + walked[0], walked_passes + walked[1]
        spec.train(was_training)
        result = {
            "acceptance_per_head": [
                round(k / max(1, r), 4) for k, r in zip(kept, reached, strict=True)
            ],
            "top1_per_head": [round(c / max(1, t), 4) for c, t in zip(correct, tried, strict=True)],
            "mean_accepted_length": round(1 + accepted_total / max(1, positions), 4),
            # what the engine reads on the same continuations (see `walked_windows`)
            "walked_accepted_length": round(walked_tokens / max(1, walked_passes), 4),
            "positions": positions,
        }
        result["engine"] = self.engine_eval(spec)
        return result

    @torch.no_grad()
    def _drafts_right(self, spec, tokens, hidden, n: int, L: int) -> torch.Tensor:
        """`[L, n]`: whether draft i of a chain from segment position t (its newest state)
        is the token at t + i + 2, given true tokens before it (what greedy verification
        checks when drafts 0..i-1 were right)."""
        if isinstance(spec, EagleHead | Eagle3Head):  # step i at t + i of the unrolled passes
            S = len(tokens)
            positions = torch.arange(S - 1, device=hidden.device)[None]
            steps = spec.unrolled(
                tokens[None, 1:].to(hidden.device), hidden[None, :-1].float(), positions, n
            )
            guesses = [
                spec.vocab_map[spec.logits(p[0, i : i + L]).argmax(-1)].cpu()
                for i, p in enumerate(steps)
            ]
        else:
            inputs = torch.stack([tokens[i + 1 : i + 1 + L] for i in range(n)], -1)[None]
            logits = spec(hidden[None, :L].float(), inputs.to(hidden.device))
            guesses = [spec.vocab_map[lg[0].argmax(-1)].cpu() for lg in logits]
        return torch.stack([g == tokens[i + 2 : i + 2 + L] for i, g in enumerate(guesses)], -1)

    def engine_eval(self, spec: MLPSpeculator) -> dict:
        """The held-out prompts through the engine with the heads drafting (greedy, k = n)."""
        from specdec.acceptors import GreedyAcceptor
        from specdec.drafters.eagle import EagleDrafter
        from specdec.drafters.eagle3 import Eagle3Drafter
        from specdec.drafters.mlp_heads import SpeculatorDrafter
        from specdec.engine import Engine
        from specdec.window import FixedWindow

        prompts = [self.corpus.prompt_ids(i) for i in self.eval_docs]
        prompts = [p for p in prompts if 1 <= len(p) <= self.cfg.max_prompt_tokens]
        # fp32 heads draft from the target's states in any dtype (propose_greedy casts).
        engine = Engine(
            self.target,
            self.tokenizer,
            self.eos_ids,
            max_batch=self.cfg.gen_batch,
            drafter_factory=lambda b, length: (
                Eagle3Drafter(spec, b, length)
                if isinstance(spec, Eagle3Head)
                else EagleDrafter(spec, b, length)
                if isinstance(spec, EagleHead)
                else SpeculatorDrafter(spec, b, self.device)
            ),
            acceptor=GreedyAcceptor(),
            window=FixedWindow(spec.config.n_predict),
        )
        params = SamplingParams(temperature=0, max_tokens=self.cfg.eval_max_tokens)
        outs = engine.generate(prompts, params)
        stats = outs[0].stats
        for o in outs[1:]:
            stats = stats + o.stats
        return {
            "mean_accepted_length": round(stats.mean_accepted_length, 4),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position],
        }

    # logs ------------------------------------------------------------------------------

    def _log(self, row: dict) -> None:
        with self.log_file.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def _read_eval(self) -> dict:
        file = self.out / "eval.json"
        return json.loads(file.read_text()) if file.is_file() else {}

    def _write_eval(self, results: dict) -> None:
        (self.out / "eval.json").write_text(json.dumps(results, indent=1) + "\n")


def _progress(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)


def train_speculator(
    model: str,
    data: str | Sequence,
    out: str | Path,
    cfg: TrainConfig | None = None,
    *,
    dtype: str | None = None,
    device: str = "cpu",
) -> MLPSpeculator:
    """Train speculator heads for a registry model or model directory on `data` ("sharegpt",
    a .jsonl/.json/.txt file, or a list of records) into `out` (resuming if it holds a
    checkpoint). `specdec generate --model MODEL --draft OUT` then drafts with them.
    `dtype` None: `target_dtype(device)`."""
    from specdec.hub import resolve
    from specdec.models.loading import load_transformer
    from specdec.tokenization import eos_token_ids, load_tokenizer

    cfg = cfg or TrainConfig()
    dtype = dtype or target_dtype(device)
    path = resolve(model, dtype)
    tokenizer = load_tokenizer(path)
    target = load_transformer(path, dtype, torch.device(device))
    records = load_records(data) if isinstance(data, str) else list(data)
    corpus = Corpus(records, tokenizer, chat=cfg.chat)
    eos = eos_token_ids(path, tokenizer)
    return SpeculatorTrainer(target, tokenizer, corpus, out, cfg, eos).run()
