"""Prefill: an admission's prompts run together, right-padded, in passes of at most a
chunk of positions over the growing cache (a stored prefix copied, not computed), and how
long a pass may be on this device."""

from __future__ import annotations

from collections.abc import Generator

import torch

from specdec.acceptors import Draft, TokenAcceptor
from specdec.drafters.base import PassStates
from specdec.errors import InvalidParameterError
from specdec.logprobs import offer_logprobs
from specdec.models.kv_cache import KVCache
from specdec.models.prefix_cache import PrefixCache
from specdec.models.transformer import Transformer, pass_spans, right_pad
from specdec.sampling import request_probs
from specdec.sequence import LiveSequence
from specdec.verify import processed

# The most positions a prefill pass computes on a CPU unless told (`--prefill-chunk auto`).
# One long pass allocates tensors over glibc's 32 MiB mmap ceiling ([4,096, 17,920] bf16 for
# the 1.5B's MLP at 4 x 1,024 tokens), which come from fresh pages every time: 2.4 M page
# faults and 5-7 s of system time a prefill there. Passes of 512 positions fault next to
# never and took 0.75-0.87x the one pass's time at 1,024-token prompts (int4 and bf16,
# batch 1 and 4) on the 2-vCPU Xeon; much smaller passes
# pay per pass (64: 1.24x). A GPU has no such cost and takes a prompt in one pass.
PREFILL_CHUNK_CPU = 512


def resolve_prefill_chunk(value: int | str | None, device: torch.device) -> int | None:
    """`Engine`'s `prefill_chunk` for a user's setting: "auto" (`PREFILL_CHUNK_CPU` on a
    CPU, one pass elsewhere), 0 or None (one pass), or a number of positions (>= 1)."""
    if value == "auto":
        return PREFILL_CHUNK_CPU if torch.device(device).type == "cpu" else None
    if isinstance(value, str):
        if not value.isdigit():
            raise InvalidParameterError(
                f"prefill chunk must be 'auto' or a number of positions, got {value!r}"
            )
        value = int(value)
    if value is not None and value < 0:
        raise InvalidParameterError(f"prefill chunk must be >= 0, got {value}")
    return value or None


def prefill_passes(
    model: Transformer,
    cache: KVCache,
    seqs: list[LiveSequence],
    first_row: int,
    acceptor: TokenAcceptor,
    chunk: int | None,
    prefix_cache: PrefixCache | None,
    aux_layers: tuple[int, ...] = (),
) -> Generator[None, None, tuple[torch.Tensor, PassStates]]:
    """Run the prompts of rows `first_row..` together (right-padded), in passes of at
    most `chunk` positions (B rows of `chunk // B`, at least 1), yielding
    between passes; sample each row's first token `[B]` and also return the states of
    the positions computed (the last: its source). A prompt's stored prefix
    (`prefix_cache`) is copied, not computed.

    A pass appends each row's next positions to its cache and attends to what earlier
    passes wrote, as a verify pass does; a row whose prompt ended in an earlier pass
    adds nothing (`num_new` 0). Each row's logits come from the pass holding its last
    position."""
    prompts = [s.prompt_ids for s in seqs]
    reused = [0] * len(seqs)
    if prefix_cache is not None:
        reused = [prefix_cache.load(cache, first_row + i, p) for i, p in enumerate(prompts)]
    for seq, n in zip(seqs, reused, strict=True):
        seq.stats.cached_tokens = n
    feed = [p[n:] for p, n in zip(prompts, reused, strict=True)]
    tokens, lengths = right_pad(feed, model.device)  # [B, T] device, [B] host
    last = lengths - 1  # [B] each row's last position
    hidden, aux, logits = [], [], None
    try:
        for start, stop, num_new in pass_spans(lengths, chunk):
            if start:
                yield
            out = model(
                tokens[:, start:stop],
                cache,
                num_new=num_new,
                logits_at=(last - start).clamp(0, stop - start - 1)[:, None],
                first_row=first_row,
                aux_layers=aux_layers,
            )
            hidden.append(out.hidden)
            aux.append(out.aux)
            if logits is None:
                logits = out.logits  # [B, 1, V]
            else:  # the rows whose last position this pass holds
                ends = ((last >= start) & (last < stop)).to(logits.device)
                logits = torch.where(ends[:, None, None], out.logits, logits)
    except BaseException:  # the rows stay free: forget the prefixes copied into them
        for i in range(len(seqs)):
            cache.reset_row(first_row + i)
        raise
    hidden = hidden[0] if len(hidden) == 1 else torch.cat(hidden, 1)  # [B, T, H]
    aux = None if aux[0] is None else torch.cat(aux, 1)  # [B, T, k*H]
    logits = processed(seqs, logits, lambda: [[[]] for _ in seqs])  # [B, 1, V]
    probs = request_probs(logits, [s.params for s in seqs])
    draft = Draft.empty(len(seqs), model.device)
    verdict = acceptor(draft, probs, [s.generator for s in seqs])
    if any(s.logprobs is not None for s in seqs):
        emitted = verdict.tokens.tolist()
        offer_logprobs(seqs, logits, probs, [[0]] * len(seqs), emitted)
    states = PassStates(tokens, hidden, lengths.to(hidden.device), first_row, aux)
    if prefix_cache is not None:
        for i, p in enumerate(prompts):
            prefix_cache.save(cache, first_row + i, p)
    return verdict.tokens[:, 0], states
