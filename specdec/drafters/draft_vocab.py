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
from collections.abc import Iterable

import torch

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
    from specdec.models.registry import cache_root

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

    from specdec.bench.workloads import sharegpt_conversations, sharegpt_prompts

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
