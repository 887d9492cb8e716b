"""Peer implementations run in the same process as ours, for side-by-side figures."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def hf_greedy(
    model, prompt: Sequence[int], max_tokens: int, eos: Sequence[int] | None = None, assistant=None
) -> list[int]:
    """transformers' greedy `generate` (assisted generation when `assistant` is given):
    the new token ids. With `eos=None` it generates exactly `max_tokens`."""
    ids = torch.tensor([list(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens if eos is None else None,
        eos_token_id=list(eos) if eos else None,
        pad_token_id=eos[0] if eos else 0,
        assistant_model=assistant,
    )
    return out[0, len(prompt) :].tolist()
