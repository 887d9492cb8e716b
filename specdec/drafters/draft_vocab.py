"""A draft model's vocabulary head cut to the ids it is likely to need (FR-Spec, Zhao et
al. 2025).

Why: a small draft model spends much of each step on its vocabulary head. The 0.5B Qwen
draft's head is 151,936 x 896, 28% of the weights a step reads, for ids most of which
never come up. Scoring only the N most frequent ids makes every draft step cheaper; a
token outside them can no longer be drafted, so acceptance falls by about the share of
the target's tokens that lie outside (measured on ShareGPT answers with the Qwen
tokenizer: 3% at 32,768 ids, 1.4% at 49,152). q stays a distribution (the softmax over
the kept ids, zero elsewhere), so the lossless acceptors stay lossless: the output does
not change, only how often a draft is kept.

The ids are counted once per tokenizer over the answers of 3,000 ShareGPT conversations
(the package the bench's chat prompts come from; the conversations of its first 64
prompts are left out), stored under `$SPECDEC_HOME/vocab/`, and the
tokenizer's end-of-sequence ids are always kept (a draft that cannot end a turn loses a
step at the end of every answer).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable

import torch
from torch import nn

from specdec.kernels.quant import Int4Linear
from specdec.models.transformer import Transformer

log = logging.getLogger(__name__)

DOCUMENTS = 3000  # ShareGPT conversations counted (~3.4M answer tokens with Qwen's tokenizer)
HELD_OUT = 64  # the bench's first ShareGPT prompts (seed 0), whose conversations are not counted


def prune_vocab_head(model: Transformer, ids: torch.Tensor) -> Transformer:
    """`model` (in place) with a vocabulary head that scores only `ids` [N], in their
    order: its logits are [.., N], column j for id ids[j]. Quantized heads keep their
    blocks (`Linear.output_rows`). Call before `tune_kernels` (the new head has no plan)."""
    head = model.lm_head
    if hasattr(head, "inner"):
        raise ValueError("a tensor-parallel vocabulary head cannot be pruned")
    model.lm_head = head.output_rows(ids.to(torch.long))
    return model


def head_rows(head: nn.Module) -> Callable[[torch.Tensor], nn.Module]:
    """`ids [M] ->` a layer scoring only those outputs of the vocabulary head `head`, with
    its weights (what `ContextIds` widens a cut head with). It holds as little of `head` as
    it can: of an int4 head only the 4-bit blocks (77 MB for the 0.5B's, whose dequantized
    copy is 272 MB more), of any other the layer itself (an unquantized head tied to the
    embeddings shares their storage)."""
    if not isinstance(head, Int4Linear) or head.bias is not None:
        return head.output_rows
    blocks, dtype, tiled = head.q4, head.weight.dtype, head.tiles.numel() > 0
    return lambda ids: Int4Linear.from_blocks(blocks.rows(ids), dtype, tiles=tiled)


# The default cut on a CPU (`LLM(draft_vocab=None)`): the lowest ids, widened by the context.
AUTO_DRAFT_VOCAB = 65536


def lowest_ids(n: int, usable: int, keep: Iterable[int] = ()) -> torch.Tensor:
    """The `n` lowest ids below `usable`, with `keep` among them (in place of the highest
    ones); sorted. A byte-level BPE numbers its merges roughly by use, so the lowest ids
    are the frequent ones without counting anything: measured on the int4 pair's answers to
    the bench's 12 code prompts, the lowest 65,536 of Qwen's ids could draft
    0.983 of the tokens, and 0.991 widened by the context (`ContextIds`), as many as
    ShareGPT's 65,536 most frequent ones alone."""
    keep = sorted({int(t) for t in keep if int(t) < usable})
    if n >= usable:
        return torch.arange(usable)
    kept = set(keep)
    low = [t for t in range(n) if t not in kept][: n - len(keep)]
    return torch.tensor(sorted(low + keep), dtype=torch.long)


def frequent_ids(tokenizer, n: int, usable: int, keep: Iterable[int] = ()) -> torch.Tensor:
    """The `n` ids below `usable` most frequent in ShareGPT answers as `tokenizer` splits
    them, with `keep` (e.g. the end-of-sequence ids) among them; sorted. Counted once per
    tokenizer and stored (`$SPECDEC_HOME/vocab/`)."""
    keep = sorted({int(t) for t in keep if int(t) < usable})
    if n >= usable:
        return torch.arange(usable)
    ranked = _ranked_ids(tokenizer)
    kept = set(keep)
    chosen = keep + [t for t in ranked if t < usable and t not in kept]
    if len(chosen) < n:  # ids never seen: the lowest ones (BPE merges come roughly by use)
        taken = set(chosen)
        chosen += [t for t in range(usable) if t not in taken][: n - len(chosen)]
    return torch.tensor(sorted(chosen[:n]), dtype=torch.long)


def _ranked_ids(tokenizer) -> list[int]:
    """Every id seen in the counted answers, most frequent first (ties: lower id first)."""
    from specdec.paths import cache_root

    vocab = tokenizer.get_vocab()
    key = hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16]
    path = cache_root() / "vocab" / f"sharegpt-{DOCUMENTS}-{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    counts = _count(tokenizer)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(ranked))
    partial.replace(path)
    return ranked


def _count(tokenizer) -> Counter[int]:
    import random

    from specdec.data import sharegpt_conversations, sharegpt_prompts

    log.info("specdec: counting token ids over %d ShareGPT conversations (once)", DOCUMENTS)
    held_out = set(sharegpt_prompts(HELD_OUT, seed=0))  # the bench's chat prompts
    convs = [c for c in sharegpt_conversations() if _first_turn(c) not in held_out]
    random.Random(0).shuffle(convs)
    counts: Counter[int] = Counter()
    for conv in convs[:DOCUMENTS]:
        for turn in conv.get("conversations") or []:
            if turn.get("from") == "gpt":
                text = turn.get("value", "")
                counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def _first_turn(conv: dict) -> str:
    turns = conv.get("conversations") or [{}]
    return turns[0].get("value", "").strip()


class ContextIds:
    """A cut head widened by the ids of the rows' own histories (prompt and output so far).

    Why: the ids a cut head misses most are the words of the task itself (a function
    named ` palindrome`, `.balance`), which the prompt already holds and the answer
    repeats. Measured on the int4 pair's answers to the bench's 12 code prompts:
    a head of ShareGPT's 32,768 most frequent ids could draft 0.958 of the tokens alone,
    0.989 widened by the context, as much as a static head of 65,536 ids (0.991), and a
    32,768-id head makes the 0.5B's draft step 7% cheaper than a 65,536-id one.

    The ids outside the cut that some live row's history holds are scored by a small
    head over their rows of the whole head (`rows_of(ids)`, e.g. `head_rows`: the same
    weights), rebuilt when that set changes (a row admitted or reset, a new id
    committed): the draft's logit columns are then `ids` = the cut's ids followed by those.
    """

    def __init__(
        self, rows_of: Callable[[torch.Tensor], nn.Module], kept: torch.Tensor, usable: int
    ) -> None:
        self.rows_of = rows_of
        self.kept = kept  # [N] the cut head's ids, in its column order
        # One byte per usable id, 1 where the cut keeps it. Built by torch: a set of the
        # 65,536 default ids took ~6 ms here (0.4-0.9 this way), paid by every new drafter
        # before its first prefill.
        in_cut = torch.zeros(usable, dtype=torch.uint8)
        in_cut[kept.cpu()] = 1
        self._in_cut = bytes(in_cut.numpy())
        self.usable = usable
        self.rows: list[set[int]] = []  # per row: its history's ids outside the cut
        self.extra = torch.zeros(0, dtype=torch.long)  # [M] the ids the small head scores
        self.head = None  # scores `extra`; None when M = 0
        self.ids = kept  # [N + M] the id of each logit column
        self._stale = False

    def _outside(self, tokens) -> set[int]:
        in_cut, usable = self._in_cut, self.usable
        return {t for t in tokens if t < usable and not in_cut[t]}

    def admit(self, histories) -> None:
        for history in histories:
            self.rows.append(self._outside(history))
            self._stale |= bool(self.rows[-1])

    def add(self, row: int, tokens) -> None:
        """Tokens committed to `row`."""
        new = self._outside(tokens) - self.rows[row]
        if new:
            self.rows[row] |= new
            self._stale = True

    def move_row(self, src: int, dst: int) -> None:
        """Row `src`'s ids now belong to `dst`; the drafter then resets `src`."""
        self.rows[dst] = self.rows[src]

    def reset_row(self, row: int) -> None:
        if row == len(self.rows) - 1:
            self.rows.pop()
        else:
            self.rows[row] = set()
        self._stale = True

    def logits(self, logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The cut head's fp32 logits [B, N] and the final states [B, H] they came from ->
        logits [B, N + M] over `ids`."""
        self._refresh()
        if self.head is None:
            return logits
        return torch.cat([logits, self.head(hidden).float()], -1)

    def _refresh(self) -> None:
        if not self._stale:
            return
        self._stale = False
        extra = sorted(set().union(*self.rows))
        if extra == self.extra.tolist():
            return
        device = self.kept.device
        self.extra = torch.tensor(extra, dtype=torch.long, device=device)
        self.head = self.rows_of(self.extra) if extra else None
        self.ids = torch.cat([self.kept, self.extra]) if extra else self.kept
