"""What the frozen target gives training: its states and greedy labels for token rows,
the dtype it runs in, and the throughput of the target's and the heads' work."""

from __future__ import annotations

import time

import torch


class Throughput:
    """Tokens per second of the two costs of training, kept apart because they differ by
    orders of magnitude and are bought differently: `target` counts the tokens whose states
    the frozen target produced (stage-1 passes; stage-2 generation and its state pass) per
    second spent in the target, `heads` the positions trained per second of head steps
    (forward, backward, optimizer). Cached states cost neither."""

    def __init__(self) -> None:
        self.tokens = {"target": 0, "heads": 0}
        self.seconds = {"target": 0.0, "heads": 0.0}

    def add(self, kind: str, tokens: int, seconds: float) -> None:
        self.tokens[kind] += tokens
        self.seconds[kind] += seconds

    def rate(self, kind: str) -> float | None:
        """Tokens per second so far, None before any was timed."""
        s = self.seconds[kind]
        return self.tokens[kind] / s if s > 0 else None

    def postfix(self) -> dict[str, str]:
        """For a progress bar: `target=1.2k/s heads=35k/s` ('-' where nothing ran yet)."""
        return {k: "-" if (r := self.rate(k)) is None else f"{si(r)}/s" for k in self.tokens}

    def log(self) -> dict[str, float | None]:
        return {f"{k}_tokens_per_s": _round(self.rate(k)) for k in self.tokens}


def si(x: float) -> str:
    return f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


class TargetStates:
    """The frozen target's final-normed hidden states for right-padded token rows (with
    `aux_layers`, the inputs of those layers instead: what an EAGLE-3 head reads); their
    cost goes to `throughput` as target time."""

    def __init__(
        self, target, throughput: Throughput | None = None, aux_layers: tuple[int, ...] = ()
    ) -> None:
        self.target = target
        self.aux_layers = tuple(aux_layers)
        self.throughput = throughput or Throughput()
        self._cache = None

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        started = time.perf_counter()
        B, T = tokens.shape
        c = self._cache
        if c is None or c.max_batch < B or c.max_len < T:
            self._cache = c = self.target.new_cache(B, T)
        c.truncate(torch.zeros(c.max_batch, dtype=torch.long))
        out = self.target(
            tokens.to(self.target.device),
            c,
            num_new=lengths,
            logits_at=torch.zeros(B, 1, dtype=torch.long),  # logits unused: one position
            aux_layers=self.aux_layers,
        )
        count = B * T if lengths is None else int(lengths.sum())
        self.throughput.add("target", count, time.perf_counter() - started)
        # [B, T, E]; [B, T, 3E] with aux_layers (eagle3 heads)
        return out.hidden if out.aux is None else out.aux


@torch.no_grad()
def target_labels(target, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The target's greedy choice after each prefix of `tokens` `[B, T]`: position j holds
    the argmax of its logits at j - 1 (position 0 keeps the text's token), computed from
    its states `hidden [B, T, E]` 256 positions at a time (their logits over a 152k
    vocabulary are 78 MB in bf16), as 2-D products: `F.linear` on a 3-D bf16 slice that
    is not contiguous took 1.5-1.6 s for 1-255 positions of the 1.5B's vocabulary head,
    where the same product in 2-D took 0.03-0.14 s (Xeon AMX, torch 2.13).

    Why: greedy verification keeps a draft token exactly when it is the target's argmax,
    so that, not the text, is what a head must predict. On text, stage 1 asks for the
    next token of ShareGPT, which the target itself predicts about half the time; the
    target's own choice is stage 2's label, here without generating: one more matrix
    product over states the step already computed."""
    B, T, E = hidden.shape
    states = hidden[:, :-1].reshape(-1, E)  # [B * (T - 1), E]
    choices = torch.cat([target.lm_head(part).argmax(-1) for part in states.split(256)])
    labels = tokens.clone()
    labels[:, 1:] = choices.view(B, T - 1)
    return labels


def target_dtype(device: str = "cpu") -> str:
    """The target's dtype when none is given: bf16, except on a CPU without bf16 matmul
    instructions, where bf16 is emulated and the target's many-token passes (the states the
    heads learn from) are far slower than in fp32: a 256-token pass of the Qwen 1.5B ran
    at 8.1 tok/s in bf16 and 52.0 in fp32 on a 2-thread AVX2 Zen 3
    (`scripts/bench_train_dtype.py`)."""
    if torch.device(device).type != "cpu":
        return "bf16"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def heads_autocast(device: str = "cpu", choice: bool | None = None) -> bool:
    """Whether the heads train under bf16 autocast: `choice` where given, else where the
    target runs in bf16 (`target_dtype`). On an Intel Xeon with AMX an optimizer step of 3
    heads over 16,384 ids ran at 1,331-1,338 positions/s against 617-657 in fp32
    (archived runs, commit 1f7ab6a); without bf16 instructions autocast
    would emulate it."""
    return choice if choice is not None else target_dtype(device) == "bf16"
