"""Learning while serving: speculator heads trained on the traffic the server already computes.

Every request the engine answers hands over stage-2 data for free: the target's final-normed
state at every prompt and emitted position, and the tokens that followed. The drafter's
`RequestRecorder` follows the engine's rows and, when a row finishes, puts its tokens
`[S]` and states `[S - 1, E]` (the last token has none yet) into a bounded `TrafficBuffer`.
An `OnlineLearner` trains a copy of the heads (the student, fp32) teacher-forced on windows
of that buffer, exactly the trainer's objective (`train.head_losses`), in a background
thread; every `publish_every` steps it publishes an inference copy, and the drafter takes
the newest one at the start of its next proposal: one reference assignment, so a step
drafts with one version from start to end. Output stays lossless whatever the heads are:
they only propose, the acceptor decides.

Budget: the thread sleeps after each training step so that it is busy at most `budget` of
wall time (on a CPU its matmuls share the cores with the engine; the budget bounds that
share, it does not pin cores). A failure in the thread is kept in `error` (and logged);
training stops there and serving goes on with the last published heads.

Checkpoints go to the heads directory (`config.json` + `model.safetensors`, replaced file by
file after a complete write, plus `learn_state.json` and `learn_optimizer.pt`); a server
started again on that directory resumes from them.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import InvalidParameterError
from specdec.speculator.model import WEIGHTS, MLPSpeculator

logger = logging.getLogger("specdec.learn")
STATE = "learn_state.json"
OPTIMIZER = "learn_optimizer.pt"


@dataclass(frozen=True)
class LearnConfig:
    budget: float = 0.25  # share of wall time the trainer thread may be busy, (0, 1]
    buffer_tokens: int = 1 << 16  # tokens kept (oldest requests leave first)
    min_tokens: int = 256  # tokens buffered before training starts
    batch_size: int = 8  # windows per step
    seq_len: int = 64  # positions per window
    lr: float = 1e-3  # AdamW, constant
    publish_every: int = 5  # training steps between swaps
    checkpoint_every: int = 50  # training steps between checkpoints (0: only at close)
    window: int = 256  # engine steps in the sliding acceptance window
    seed: int = 0

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise InvalidParameterError(f"learning: {message}")

        check(0 < self.budget <= 1, f"budget must be in (0, 1], got {self.budget}")
        check(self.buffer_tokens >= self.seq_len, "buffer_tokens must be >= seq_len")
        check(self.batch_size >= 1 and self.publish_every >= 1, "sizes must be >= 1")
        check(self.checkpoint_every >= 0 and self.window >= 1, "intervals must be >= 0")


class TrafficBuffer:
    """Finished requests as (tokens [S], states [S - 1, E]) segments, oldest evicted first
    once more than `max_tokens` are held. Thread-safe: the engine adds, the trainer samples."""

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
        self, B: int, L: int, rng: random.Random
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """B windows of L positions, segments picked in proportion to their length:
        states [B, L, E] (fp32, zero past a segment's states), tokens [B, L], valid [B, L]
        (a real token). A state is real wherever a valid target follows it."""
        with self._lock:
            segments = list(self.segments)
        weights = [len(t) for t, _ in segments]
        picked = rng.choices(segments, weights=weights, k=B)
        E = picked[0][1].shape[-1]
        hidden = torch.zeros(B, L, E)
        tokens = torch.zeros(B, L, dtype=torch.long)
        valid = torch.zeros(B, L, dtype=torch.bool)
        for b, (t, h) in enumerate(picked):
            start = rng.randrange(max(1, len(t) - L + 1))
            seg_t, seg_h = t[start : start + L], h[start : start + L]
            tokens[b, : len(seg_t)], valid[b, : len(seg_t)] = seg_t.cpu(), True
            hidden[b, : len(seg_h)] = (
                seg_h.float().cpu()
            )  # a copy: engine tensors are inference-only
        return hidden, tokens, valid


class OnlineLearner:
    """Trains a copy of `heads` on the traffic buffer and publishes it as `current`.

    `train_steps(n)` trains in the caller's thread (tests, or a caller that owns the
    schedule); `start()` runs the budgeted background thread, `close()` stops it and
    checkpoints. `out`: the heads directory to checkpoint to and resume from (None: no files).
    """

    def __init__(
        self, heads: MLPSpeculator, cfg: LearnConfig | None = None, out: str | Path | None = None
    ) -> None:
        self.cfg = cfg = cfg or LearnConfig()
        self.out = None if out is None else Path(out).expanduser()
        self.buffer = TrafficBuffer(cfg.buffer_tokens)
        self.current = heads  # what the drafters propose with
        self._dtype = heads.proj[0].weight.dtype
        self.student = _copy(heads, heads).float().train().requires_grad_(True)
        self.opt = torch.optim.AdamW(self.student.trainable, lr=cfg.lr, betas=(0.9, 0.95))
        self.version, self.steps, self.loss = 0, 0, None
        self.error: str | None = None
        self._acceptance: deque[tuple[int, torch.Tensor]] = deque(maxlen=cfg.window)
        self._rng = random.Random(cfg.seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resume()

    # --- what the drafters call ---

    def record_request(self, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """A finished row: tokens [S] and the states at the first S - 1 of them."""
        if len(tokens) >= self.current.config.n_predict + 2:
            self.buffer.add(tokens, hidden)

    def record_step(self, drafted: int, num_accepted: torch.Tensor) -> None:
        """One engine step of `drafted` heads per row and the drafts kept `[B]` (kept as a
        tensor: reduced only when metrics are read, never a host sync in the step)."""
        if drafted:
            self._acceptance.append((drafted, num_accepted.detach()))

    # --- training ---

    def train_steps(self, n: int) -> int:
        """Up to n teacher-forced steps on the buffer; returns the steps taken."""
        done = 0
        for _ in range(n):
            if self.buffer.tokens < self.cfg.min_tokens:
                break
            self._train_step()
            done += 1
        return done

    def _train_step(self) -> None:
        from specdec.speculator.train import head_losses

        L = max(self.cfg.seq_len, self.student.config.n_predict + 3)
        hidden, tokens, valid = self.buffer.sample(self.cfg.batch_size, L, self._rng)
        device = self.student.proj[0].weight.device
        loss, m = head_losses(self.student, hidden.to(device), tokens.to(device), valid.to(device))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.student.trainable, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        self.loss = m.loss
        if self.steps % self.cfg.publish_every == 0:
            self.publish()
        if self.cfg.checkpoint_every and self.steps % self.cfg.checkpoint_every == 0:
            self.checkpoint()

    def publish(self) -> None:
        """The student's weights, in the serving dtype, become `current` (one assignment)."""
        with torch.no_grad():
            served = _copy(self.student, self.current).to(self._dtype)
        self.current = served.eval().requires_grad_(False)
        self.version += 1

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specdec-learn", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        b = self.cfg.budget
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                trained = self.train_steps(1)
                busy = time.perf_counter() - started
                self._stop.wait(busy * (1 - b) / b if trained else 0.05)
        except Exception as err:  # reported, never raised into serving
            self.error = f"{type(err).__name__}: {err}"
            logger.exception(
                "specdec: the heads trainer failed; serving goes on with heads version %d",
                self.version,
            )

    @property
    def training(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread and checkpoint what was published."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is None and self.steps:
            self.publish()
        self.checkpoint()

    # --- files ---

    def checkpoint(self) -> None:
        """The published heads into `out`, replacing its files only after a full write."""
        if self.out is None:
            return
        tmp = self.out / ".learn-tmp"
        self.current.save(tmp)
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
            "requests_seen": self.buffer.requests,
            "loss": None if self.loss is None else round(self.loss, 4),
            "acceptance_per_head": [
                round(k / r, 4) if r else None for k, r in zip(kept, reached, strict=True)
            ],
            "mean_accepted_length": round(1 + sum(kept) / reached[0], 4) if reached[0] else None,
            "training": self.training,
            "error": self.error,
        }


def _copy(module: MLPSpeculator, tables_from: MLPSpeculator) -> MLPSpeculator:
    """A deep copy of the heads that shares `tables_from`'s frozen target tables (the
    target's embedding and head: large, never trained) instead of copying them."""
    memo = {}
    for name in ("target_embed", "target_head"):
        mine, theirs = getattr(module, name, None), getattr(tables_from, name, None)
        if mine is not None and theirs is not None:
            memo[id(mine)] = theirs.float() if module is tables_from else theirs
    return copy.deepcopy(module, memo)


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
        for b, n in enumerate(lengths):
            row = self.rows[states.first_row + b]
            row["tokens"].append(states.tokens[b, :n].clone())
            row["hidden"].append(states.hidden[b, :n].clone())

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
