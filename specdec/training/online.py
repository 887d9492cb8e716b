"""Learning while serving: speculator heads trained on the traffic the server already computes.

Every request the engine answers hands over stage-2 data for free: the target's final-normed
state at every prompt and emitted position, and the tokens that followed. The drafter's
`RequestRecorder` follows the engine's rows and, when a row finishes, puts its tokens
`[S]` and states `[S - 1, E]` (the last token has none yet) into a bounded `TrafficBuffer`.
An `OnlineLearner` trains a copy of the heads (the student, fp32; its products under bf16
autocast where the CPU multiplies bf16 natively) teacher-forced on windows of that buffer,
exactly the trainer's objective (`train.head_losses`), in the time the engine gives it
between steps, at a rate that warms up over its first steps; every `publish_every`
optimizer steps it publishes an inference copy, and the drafter takes the newest one at the
start of its next proposal: one reference assignment, so a step drafts with one version
from start to end. Output stays lossless whatever the heads are: they only propose, the
acceptor decides.

Budget: training runs in the engine's own thread, between its steps, one micro-batch of
windows at a time (gradients accumulate over `batch_size / micro_batch` of them before an
optimizer step), so it never competes with a step for the cores. After a step
(`between_steps`), a micro-batch runs only once the serving time since the last one has
earned it: training takes at most `budget` of the wall time, so a learning engine serves at
least `1 - budget` of the throughput it would without, and no step waits for more than one
micro-batch. While the engine has nothing to do (`between_steps(idle=True)`, from the
server's loop) it trains without a budget, but only about one pass over the traffic that
arrived since (an idle server does not spin on old data). (On two CPU cores a trainer
thread beside the engine cost 24-36% of decode throughput at a 0.25 budget: every busy
second of it stalls the engine's parallel regions.) A failure is kept in `error` (and
logged); training stops there and serving goes on with the last published heads.

An eagle head (`specdec.heads.eagle`) learns the same way, with its own objective
(`train.eagle_losses`: state regression and cross-entropy over unrolled draft steps); the
learner trains its trainable form and publishes through `serve`, which makes the drafting
form (fused q/k/v, quantized, tuned kernels). An EAGLE-3 head (`specdec.heads.eagle3`)
learns from the target's auxiliary states (`PassStates.aux`) with the trainer's unrolled
objective (`train.eagle3_losses`). A row that was drafting when new weights came keeps its
cached entries from the older weights until it finishes: only its drafts suffer.

Replay: traffic alone pulls a trained head towards the last requests and away from what it
learnt offline. Where the heads directory holds the trainer's stage-2 continuations
(`stage2/`, the target's own answers with their states), a share `replay_share` of every
micro-batch's windows is drawn from them, so the head keeps its offline data in view while
it learns the traffic.

Checkpoints go to the heads directory (`config.json` + `model.safetensors`, replaced file by
file after a complete write, plus `learn_state.json` and `learn_optimizer.pt`); a server
started again on that directory resumes from them.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import InvalidParameterError
from specdec.heads.eagle import EagleHead
from specdec.heads.eagle3 import Eagle3Head
from specdec.heads.mlp import WEIGHTS, MLPSpeculator
from specdec.training.segments import STAGE2, stage2_segments

logger = logging.getLogger("specdec.learn")
STATE = "learn_state.json"
STALL_ESTIMATES = 4  # a micro-batch counts at most this many of its estimated seconds
OPTIMIZER = "learn_optimizer.pt"


@dataclass(frozen=True)
class LearnConfig:
    budget: float = 0.25  # share of the engine's wall time training may take, (0, 1]
    buffer_tokens: int = 1 << 16  # tokens kept (oldest requests leave first)
    min_tokens: int = 256  # tokens buffered before training starts
    batch_size: int = 8  # windows per optimizer step
    micro_batch: int = 2  # windows per forward and backward: the longest wait of a step
    seq_len: int = 64  # positions per window
    # AdamW's rate after the warm-up; None: 1e-3 for MLP heads, EAGLE_LR for an eagle head.
    lr: float | None = None
    # Optimizer steps over which the rate rises linearly to `lr`, counted from the
    # learner's first step (a resumed learner goes on where it was): a fresh optimizer's
    # first steps move every weight by about the rate, which a trained head pays for. From
    # the trained eagle head, 1e-3 with no warm-up left it at 1.47 tokens per pass on
    # held-out prompts after a 500-request replay, from 1.65.
    warmup_steps: int = 20
    publish_every: int = 5  # training steps between swaps
    checkpoint_every: int = 50  # training steps between checkpoints (0: only at close)
    window: int = 256  # engine steps in the sliding acceptance window
    seed: int = 0
    # Forward and backward under bf16 autocast (the student and its optimizer stay fp32);
    # None: where the device multiplies bf16 natively (`train.heads_autocast`). Measured on
    # an Intel Xeon with AMX, the Qwen 1.5B's eagle head: 263 positions/s against 124 in
    # fp32 (micro-batches of 2 windows; archived runs, commit 1f7ab6a).
    autocast: bool | None = None
    # Share of each micro-batch's windows drawn from the heads directory's stored stage-2
    # data, where it holds some (see "Replay"); 0: the traffic only.
    replay_share: float = 0.5

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise InvalidParameterError(f"learning: {message}")

        check(0 < self.budget <= 1, f"budget must be in (0, 1], got {self.budget}")
        check(self.buffer_tokens >= self.seq_len, "buffer_tokens must be >= seq_len")
        sizes = (self.batch_size, self.micro_batch, self.publish_every)
        check(min(sizes) >= 1, "batch_size, micro_batch and publish_every must be >= 1")
        check(self.checkpoint_every >= 0 and self.window >= 1, "intervals must be >= 0")
        check(self.lr is None or self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.warmup_steps >= 0, "warmup_steps must be >= 0")
        share = self.replay_share
        check(0 <= share < 1, f"replay_share must be in [0, 1), got {share}")


class TrafficBuffer:
    """Finished requests as (tokens [S], states [S - 1, E]) segments, oldest evicted first
    once more than `max_tokens` are held. The engine's thread adds and samples; locked, so
    that a caller's own `train_steps` in another thread may sample too."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.segments: deque[tuple[torch.Tensor, torch.Tensor]] = deque()
        self.tokens = 0  # held
        self.requests = 0  # ever added
        self._lock = threading.Lock()

    def add(self, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        tokens = tokens[-self.max_tokens :]
        hidden = hidden[-(len(tokens) - 1) :] if len(tokens) > 1 else hidden[:0]
        with self._lock:
            self.segments.append((tokens, hidden))
            self.tokens += len(tokens)
            self.requests += 1
            while self.tokens > self.max_tokens:
                old, _ = self.segments.popleft()
                self.tokens -= len(old)

    def __len__(self) -> int:
        return len(self.segments)

    def sample(
        self, B: int, L: int, rng: random.Random, with_states: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """B windows of L positions, segments picked in proportion to their length:
        states [B, L, E] (fp32, zero past a segment's states), tokens [B, L], valid [B, L]
        (a real token), and with `with_states` also `[B, L]` bool: a real state (every
        real token's but a segment's last)."""
        with self._lock:
            segments = list(self.segments)
        weights = [len(t) for t, _ in segments]
        picked = rng.choices(segments, weights=weights, k=B)
        E = picked[0][1].shape[-1]
        hidden = torch.zeros(B, L, E)
        tokens = torch.zeros(B, L, dtype=torch.long)
        valid = torch.zeros(B, L, dtype=torch.bool)
        real = torch.zeros(B, L, dtype=torch.bool)
        for b, (t, h) in enumerate(picked):
            start = rng.randrange(max(1, len(t) - L + 1))
            seg_t, seg_h = t[start : start + L], h[start : start + L]
            tokens[b, : len(seg_t)], valid[b, : len(seg_t)] = seg_t.cpu(), True
            hidden[b, : len(seg_h)] = (
                seg_h.float().cpu()
            )  # a copy: engine tensors are inference-only
            real[b, : len(seg_h)] = True
        return (hidden, tokens, valid, real) if with_states else (hidden, tokens, valid)


class OnlineLearner:
    """Trains a copy of `heads` on the traffic buffer and publishes it as `current`.

    The engine gives it time through its drafter: `between_steps()` after every step and
    `between_steps(idle=True)` while idle (see the module's "Budget"). `train_steps(n)`
    trains n optimizer steps at once in the caller's thread (tests, or a caller that owns
    the schedule). `close()` checkpoints. `out`: the heads directory to checkpoint to and
    resume from (None: no files).
    """

    def __init__(
        self,
        heads: MLPSpeculator | EagleHead,
        cfg: LearnConfig | None = None,
        out: str | Path | None = None,
        serve: Callable | None = None,
        current=None,
    ) -> None:
        """`heads`: their trainable form (what is checkpointed). `serve(heads)` makes the
        form drafters propose with from a copy of it (default: that copy); `current`: the
        served form at the start (default: `heads`)."""
        self.cfg = cfg = cfg or LearnConfig()
        self.out = None if out is None else Path(out).expanduser()
        self.buffer = TrafficBuffer(cfg.buffer_tokens)
        # what a target pass hands the heads: an EAGLE-3 head reads the auxiliary states
        self.reads_aux = isinstance(heads, Eagle3Head)
        self._dtype = next(heads.parameters()).dtype
        self.replay = None  # the stored stage-2 data replayed beside the traffic
        if cfg.replay_share:
            self.replay = _replay_store(self.out, heads, cfg.buffer_tokens, self._dtype)
        self.serve = serve
        self.published = heads  # the trainable form of `current`: what a checkpoint saves
        self.current = heads if current is None else current  # what the drafters use
        self.student = _student(heads)
        eagle = isinstance(heads, (EagleHead, Eagle3Head))
        self.lr = cfg.lr if cfg.lr is not None else (EAGLE_LR if eagle else MLP_LR)
        self.opt = torch.optim.AdamW(self.student.trainable, lr=self.lr, betas=(0.9, 0.95))
        self.version, self.steps, self.loss = 0, 0, None
        self.error: str | None = None
        self.closed = False
        self.train_s = 0.0  # seconds spent training, in all
        self._windows, self._batch_loss = 0, 0.0  # of the optimizer step being accumulated
        self._micro_s = 0.0  # running estimate of one micro-batch's seconds (0: not timed)
        self._credit = 0.0  # training seconds the serving time has earned
        self._idle_tokens = 0  # tokens idle training may still go through (new traffic)
        self._clock = time.perf_counter  # (a test's fake clock replaces it)
        self._tick = self._clock()  # the end of the last `between_steps`
        self._acceptance: deque[tuple[int, torch.Tensor]] = deque(maxlen=cfg.window)
        self._rng = random.Random(cfg.seed)
        from specdec.training.target import heads_autocast

        self._device = next(self.student.parameters()).device
        self.autocast = heads_autocast(self._device.type, cfg.autocast)
        self._resume()

    # --- what the drafters call ---

    def record_request(self, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """A finished row: tokens [S] and the states at the first S - 1 of them."""
        if len(tokens) >= self.current.config.n_predict + 2:
            self.buffer.add(tokens, hidden)
            self._idle_tokens += len(tokens)

    def record_step(self, drafted: int, num_accepted: torch.Tensor) -> None:
        """One engine step of `drafted` heads per row and the drafts kept `[B]` (kept as a
        tensor: reduced only when metrics are read, never a host sync in the step)."""
        if drafted:
            self._acceptance.append((drafted, num_accepted.detach()))

    def between_steps(self, idle: bool = False) -> bool:
        """The engine's time between its steps. After a step: one micro-batch once the
        wall time served since the last call has earned it (`budget` of wall time; at most
        one micro-batch saved up). `idle` (nothing to serve): one micro-batch while the
        traffic that arrived since has not been gone through once. Returns whether it
        trained. Never raises: a failure stops training and is reported."""
        cfg = self.cfg
        seen = cfg.micro_batch * cfg.seq_len  # tokens one micro-batch goes through
        now = self._clock()
        if idle:
            due = self._idle_tokens >= seen
        else:
            b = cfg.budget
            earned = (now - self._tick) * b / (1 - b) if b < 1 else math.inf
            self._credit = min(self._credit + earned, self._micro_s)
            due = self._credit >= self._micro_s
        trained = False
        if due and self.ready:
            try:  # the engine's step runs in inference mode: training needs autograd back
                with torch.inference_mode(False), torch.enable_grad():
                    self._micro_step()
            except Exception as err:  # reported, never raised into serving
                self.error = f"{type(err).__name__}: {err}"
                logger.exception(
                    "specdec: the heads trainer failed; serving goes on with heads version %d",
                    self.version,
                )
            else:
                trained = True
            spent = self._clock() - now
            self.train_s += spent
            # A micro-batch far over its estimate was stalled (a paused process, a swapped
            # page, a neighbour), not slow: it counts at most STALL_ESTIMATES estimates,
            # against the budget and in the estimate. Counted whole, one micro-batch paused
            # for 413 s left the credit that far short and the estimate at minutes, and a
            # replay learnt nothing for its next 186 requests.
            if self._micro_s:
                spent = min(spent, STALL_ESTIMATES * self._micro_s)
            self._micro_s = spent if not self._micro_s else 0.8 * self._micro_s + 0.2 * spent
            if idle:
                self._idle_tokens -= seen
            else:
                self._credit -= spent
        self._tick = self._clock()
        return trained

    def restart_clock(self) -> None:
        """Serving (re)starts now: the time since the last step earns no training (for a
        caller that interleaves engines on one machine, as a side-by-side benchmark does)."""
        self._tick = self._clock()

    def recorder(self) -> RequestRecorder:
        """A recorder of one drafter's rows for this learner (the drafter holds it, so the
        drafters need not import the training package)."""
        return RequestRecorder(self)

    # --- training ---

    @property
    def training(self) -> bool:
        """Neither failed nor closed."""
        return not (self.error or self.closed)

    @property
    def ready(self) -> bool:
        """Training, with enough traffic buffered."""
        return self.training and self.buffer.tokens >= self.cfg.min_tokens

    def train_steps(self, n: int) -> int:
        """Up to n optimizer steps on the buffer, now; returns the steps taken."""
        done = 0
        while done < n and self.ready:
            done += self._micro_step()
        return done

    def _micro_step(self) -> bool:
        """Forward and backward over one micro-batch of windows; the optimizer step (and
        any publish or checkpoint) when they complete a batch. Returns whether it stepped."""
        from specdec.training.losses import eagle3_losses, eagle_losses, head_losses

        cfg = self.cfg
        B = min(cfg.micro_batch, cfg.batch_size - self._windows)
        L = max(cfg.seq_len, self.student.config.n_predict + 3)
        hidden, tokens, valid, real = self._windows_of(B, L)
        device = self._device
        hidden, tokens = hidden.to(device), tokens.to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=self.autocast):
            if isinstance(self.student, Eagle3Head):
                steps = min(EAGLE_STEPS, self.student.config.n_predict)
                loss, m = eagle3_losses(self.student, hidden, tokens, valid.to(device), steps=steps)
            elif isinstance(self.student, EagleHead):  # its regression needs the state itself
                steps = min(EAGLE_STEPS, self.student.config.n_predict)
                noise = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.steps)
                loss, m = eagle_losses(
                    self.student, hidden, tokens, real.to(device), steps=steps, generator=noise
                )
            else:
                loss, m = head_losses(self.student, hidden, tokens, valid.to(device))
        (loss * (B / cfg.batch_size)).backward()  # the batch's mean, accumulated
        self._windows += B
        self._batch_loss += m.loss * B / cfg.batch_size
        if self._windows < cfg.batch_size:
            return False
        torch.nn.utils.clip_grad_norm_(self.student.trainable, 1.0)
        for group in self.opt.param_groups:
            group["lr"] = self.rate(self.steps)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        self.loss, self._windows, self._batch_loss = self._batch_loss, 0, 0.0
        if self.steps % cfg.publish_every == 0:
            self.publish()
        if cfg.checkpoint_every and self.steps % cfg.checkpoint_every == 0:
            self.checkpoint()
        return True

    def _windows_of(self, B: int, L: int) -> tuple[torch.Tensor, ...]:
        """B windows (`TrafficBuffer.sample` with states), each from the stored stage-2 data
        with probability `replay_share` where there is some, else from the traffic."""
        stored = 0
        if self.replay is not None:
            stored = sum(self._rng.random() < self.cfg.replay_share for _ in range(B))
        parts = [
            buffer.sample(n, L, self._rng, with_states=True)
            for buffer, n in ((self.buffer, B - stored), (self.replay, stored))
            if n
        ]
        return tuple(torch.cat(tensors) for tensors in zip(*parts, strict=True))

    def rate(self, step: int) -> float:
        """The learning rate of optimizer step `step` (from 0): the warm-up, then `lr`."""
        warmup = self.cfg.warmup_steps
        return self.lr * min(1.0, (step + 1) / warmup) if warmup else self.lr

    def publish(self) -> None:
        """The student's weights, in the serving dtype (and the serving form), become
        `current` (one assignment)."""
        with torch.no_grad():
            plain = copy_heads(self.student, self.published).to(self._dtype)
            plain = plain.eval().requires_grad_(False)
            served = plain if self.serve is None else self.serve(copy_heads(plain, plain))
        self.published = plain
        self.current = served.eval().requires_grad_(False)
        self.version += 1

    def close(self) -> None:
        """Stop training and checkpoint what was learnt (a half-accumulated batch is
        dropped)."""
        if self.closed:
            return
        self.closed = True
        if self.error is None and self.steps:
            self.publish()
        self.checkpoint()

    # --- files ---

    def checkpoint(self) -> None:
        """The published heads into `out`, replacing its files only after a full write."""
        if self.out is None:
            return
        tmp = self.out / ".learn-tmp"
        self.published.save(tmp)
        torch.save(self.opt.state_dict(), tmp / OPTIMIZER)
        state = {"version": self.version, "steps": self.steps, "loss": self.loss}
        (tmp / STATE).write_text(json.dumps(state) + "\n")
        for name in (WEIGHTS, "config.json", OPTIMIZER, STATE):  # the state last: it vouches
            os.replace(tmp / name, self.out / name)
        tmp.rmdir()

    def _resume(self) -> None:
        if self.out is None or not (self.out / STATE).is_file():
            return
        state = json.loads((self.out / STATE).read_text())
        self.version, self.steps, self.loss = state["version"], state["steps"], state["loss"]
        try:
            self.opt.load_state_dict(torch.load(self.out / OPTIMIZER, weights_only=True))
        except (OSError, RuntimeError, ValueError) as err:  # heads changed: a fresh optimizer
            logger.warning("specdec: learning resumes with a fresh optimizer (%s)", err)

    # --- metrics ---

    def metrics(self) -> dict:
        """Heads version, buffer, last loss and acceptance per head over the last `window`
        engine steps (head i: rows whose heads 0..i-1 were all kept, and of those, kept)."""
        n = self.current.config.n_predict
        reached, kept = [0] * n, [0] * n
        for drafted, accepted in list(self._acceptance):
            acc = accepted.cpu()
            for i in range(drafted):
                reached[i] += int((acc >= i).sum())
                kept[i] += int((acc > i).sum())
        return {
            "version": self.version,
            "steps": self.steps,
            "buffer_tokens": self.buffer.tokens,
            "buffer_requests": len(self.buffer),
            "replay_tokens": 0 if self.replay is None else self.replay.tokens,
            "requests_seen": self.buffer.requests,
            "loss": None if self.loss is None else round(self.loss, 4),
            "acceptance_per_head": [
                round(k / r, 4) if r else None for k, r in zip(kept, reached, strict=True)
            ],
            "mean_accepted_length": round(1 + sum(kept) / reached[0], 4) if reached[0] else None,
            "training": self.training,
            "train_s": round(self.train_s, 3),
            "micro_batch_s": round(self._micro_s, 4),
            "error": self.error,
        }


TABLES = ("target_embed", "target_head", "embed", "head_rows", "to_draft", "vocab_map")
EAGLE_STEPS = 3  # draft steps an eagle head's objective unrolls (as the trainer's default)
MLP_LR = 1e-3  # the default rates (`LearnConfig.lr`): MLP heads learn from scratch at 1e-3;
# an eagle head under `--learn` is always one trained offline (untrained heads start as MLP
# heads), which learning should refine, not retrain: the Qwen 1.5B's eagle head, trained
# to a final rate of 3e-5, lost 0.10-0.15 tokens per pass on held-out chat over a
# 500-request replay at 3e-4 (k = 5: 2.02-2.06 -> 1.87-1.94) and held at 3e-5 (2.00-2.05).
EAGLE_LR = 3e-5


def _replay_store(out: Path | None, heads, max_tokens: int, dtype) -> TrafficBuffer | None:
    """The stage-2 continuations stored in the heads directory `out` (the trainer's), up to
    `max_tokens`, their states in the serving dtype; None where there are none. Files whose
    states do not fit the heads (another kind's) are left out with a warning."""
    files = [] if out is None else sorted((out / STAGE2).glob("chunk-*.safetensors"))
    width = getattr(heads, "feature_size", None) or heads.config.emb_dim
    store = TrafficBuffer(max_tokens)
    for file in files:
        try:
            segments = stage2_segments(file)
        except Exception as err:  # a torn or foreign file costs its replay, never serving
            logger.warning("specdec: learning leaves out %s (%s)", file, err)
            continue
        for tokens, states in segments:
            if states.shape[-1] != width:
                logger.warning(
                    "specdec: learning leaves out %s: states of width %d, the heads read %d",
                    file,
                    states.shape[-1],
                    width,
                )
                break
            store.add(tokens, states[:-1].to(dtype))  # the last token's state predicts nothing
        if store.tokens >= max_tokens:
            break
    return store if len(store) else None


def copy_heads(module, tables_from):
    """A deep copy of the heads that shares `tables_from`'s frozen target tables (the
    target's embedding and head: large, never trained) instead of copying them."""
    memo = {}
    for name in TABLES:
        mine, theirs = getattr(module, name, None), getattr(tables_from, name, None)
        if mine is not None and theirs is not None:
            memo[id(mine)] = theirs
    return copy.deepcopy(module, memo)


def _student(heads):
    """The fp32 copy that trains. MLP heads take fp32 copies of the target's tables; an
    eagle head shares them in the serving dtype (only its layer trains, and its reads of
    the tables cast what they take)."""
    if isinstance(heads, EagleHead):
        student = copy_heads(heads, heads)
        for param in student.parameters():
            param.data = param.data.float()
    else:
        tables = [getattr(heads, name, None) for name in TABLES]
        memo = {id(t): t.float() for t in tables if t is not None and t.is_floating_point()}
        student = copy.deepcopy(heads, memo).float()
    return student.train().requires_grad_(True)


class RequestRecorder:
    """Follows the engine's rows like a drafter (admit / commit / move_row / reset_row) and
    gives each finished row's tokens and states to the learner."""

    def __init__(self, learner: OnlineLearner) -> None:
        self.learner = learner
        self.rows: list[dict | None] = []

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        for h in histories:
            self.rows.append({"tokens": [], "hidden": [], "pending": int(h[-1])})

    def record(self, states) -> None:
        """A pass's kept positions (`PassStates`): copied, so the pass's tensors can go."""
        lengths = states.lengths.tolist()  # not the step's sync: only when learning
        features = states.aux if self.learner.reads_aux else states.hidden
        for b, n in enumerate(lengths):
            row = self.rows[states.first_row + b]
            row["tokens"].append(states.tokens[b, :n].clone())
            row["hidden"].append(features[b, :n].clone())

    def commit(self, next_tokens: torch.Tensor) -> None:
        for row, token in zip(self.rows, next_tokens.tolist(), strict=False):
            if row is not None:
                row["pending"] = token

    def move_row(self, src: int, dst: int) -> None:
        self._finish(dst)
        self.rows[dst], self.rows[src] = self.rows[src], None

    def reset_row(self, row: int) -> None:
        self._finish(row)
        self.rows[row] = None
        while self.rows and self.rows[-1] is None:
            self.rows.pop()

    def _finish(self, i: int) -> None:
        row = self.rows[i] if i < len(self.rows) else None
        if row is None or not row["tokens"]:
            return
        hidden = torch.cat(row["hidden"])  # [S - 1, E]
        last = torch.tensor([row["pending"]], device=hidden.device)
        tokens = torch.cat([*row["tokens"], last])  # [S]: the final token has no state yet
        self.learner.record_request(tokens, hidden)
