"""Per-request logits processing: logit_bias, presence/frequency penalties, grammar masks.

The contract: a `RequestProcessor` belongs to one request and follows its committed output
(`accept`, one token at a time). Called on the target's logits of a pass,
`processor(logits [T, V], paths)` returns them processed, position j as if the tokens
`paths[j]` (drafts, not committed) followed the committed output: a verify pass's
position j sees the drafts before it, a tree node its ancestors. So the acceptor judges
each draft token against the distribution plain decoding would have sampled it from, and
the lossless acceptors stay lossless for the processed distribution. The engine applies
it in one place, before the request's temperature/top-k/top-p (`process_logits`).

In order: `logit_bias` added; `presence_penalty` subtracted from every token generated so
far and `frequency_penalty` times its count (OpenAI's definition, over the output only);
then the grammar's mask (`specdec.grammar`) sets what it forbids to -inf. A position after
a draft token the grammar forbids is left unmasked: the acceptor rejects that draft token
(p = 0 there), so no token is ever taken from it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.grammar import GrammarCompiler, allowed
from specdec.params import SamplingParams


class RequestProcessor:
    def __init__(
        self, params: SamplingParams, vocab_size: int, device, grammars: GrammarCompiler | None
    ) -> None:
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        self.vocab_size = vocab_size
        self.bias = None
        if params.logit_bias:
            ids, values = zip(*params.logit_bias, strict=True)
            self.bias = torch.zeros(vocab_size, device=device)  # [V]
            self.bias[list(ids)] = torch.tensor(values, device=device)
        # Each token's count in the output so far: [V] on the logits' device.
        self.counts = torch.zeros(vocab_size, device=device)
        self.penalised = bool(self.presence or self.frequency)
        self.matcher = None if params.grammar is None else grammars.matcher(params.grammar)
        self.eos_ids = frozenset() if grammars is None else frozenset(grammars.eos_ids)

    def accept(self, token: int) -> None:
        """A committed output token."""
        if self.penalised:
            self.counts[token] += 1
        if self.matcher is not None and not self.matcher.is_stopped():
            self.matcher.try_consume_tokens([token])

    def __call__(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """`logits [T, V]` (one row's positions) -> processed `[T, V]` (a new tensor)."""
        T = logits.shape[0]
        out = logits.to(torch.float32, copy=True)
        if self.bias is not None:
            out = out + self.bias[: out.shape[1]]
        if self.penalised:
            counts = self.counts.expand(T, -1).clone()  # [T, V]
            for j, path in enumerate(paths):
                if path:
                    ids = torch.tensor(list(path), device=counts.device)
                    counts[j].index_add_(0, ids, torch.ones(len(ids), device=counts.device))
            counts = counts[:, : out.shape[1]]
            out = out - self.frequency * counts - self.presence * (counts > 0).float()
        if self.matcher is not None:
            masks = self._masks(paths)  # [T, V] bool (None: unconstrained)
            for j, mask in enumerate(masks):
                if mask is not None:  # a draft's logits may be narrower than the target's
                    mask = mask[: out.shape[1]].to(out.device)
                    out[j, : len(mask)].masked_fill_(~mask, float("-inf"))
                    out[j, len(mask) :] = float("-inf")
        return out

    def _masks(self, paths: Sequence[Sequence[int]]) -> list[torch.Tensor | None]:
        """The grammar's allowed tokens after each path (None where a path leaves it).
        Paths are walked in order, rolling back only what the next one does not share: a
        chain's paths cost one token each, a tree's a depth-first walk. Once the grammar
        is done it allows EOS alone, and an EOS changes nothing (as `accept` has it, for
        a request that ignores EOS)."""
        m, masks = self.matcher, []
        held: list[tuple[int, bool]] = []  # the tokens walked, and whether m consumed each
        for path in paths:
            path = list(path)
            common = 0
            while common < min(len(held), len(path)) and held[common][0] == path[common]:
                common += 1
            undo = sum(consumed for _, consumed in held[common:])
            if undo:
                m.rollback(undo)
            del held[common:]
            inside = True
            for token in path[common:]:
                if m.is_stopped() and token in self.eos_ids:
                    held.append((token, False))
                elif not m.is_stopped() and m.try_consume_tokens([token]) == 1:
                    held.append((token, True))
                else:
                    inside = False
                    break
            masks.append(allowed(m, self.vocab_size) if inside else None)
        undo = sum(consumed for _, consumed in held)
        if undo:
            m.rollback(undo)
        return masks


def process_logits(
    logits: torch.Tensor,
    processors: Sequence[RequestProcessor | None],
    paths: Sequence[Sequence[Sequence[int]]],
) -> torch.Tensor:
    """`logits [B, T, V]` with row b through `processors[b]` (None: left as is), its
    positions following `paths[b]` (`chain_paths`, `tree_paths`). Returns the logits
    themselves when no row has a processor."""
    if all(p is None for p in processors):
        return logits
    rows = [
        logits[b] if p is None else p(logits[b], paths[b]).to(logits.dtype)
        for b, p in enumerate(processors)
    ]
    return torch.stack(rows)


def chain_paths(drafts: torch.Tensor, lengths: Sequence[int]) -> list[list[list[int]]]:
    """Per row, the drafts before each of a chain's k+1 positions: `drafts [B, k]`; a row's
    positions past its own draft (`lengths`) see its whole draft."""
    rows = drafts.tolist()
    k = drafts.shape[1]
    return [[row[: min(j, n)] for j in range(k + 1)] for row, n in zip(rows, lengths, strict=True)]


def tree_paths(tokens: Sequence[int], parents: Sequence[int], width: int) -> list[list[int]]:
    """A tree's positions (the root, then node i at 1 + i; `width` in all, pads after the
    nodes seeing the root): each node's path from the root, itself included."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(tokens, parents, strict=True):
        paths.append((paths[1 + parent] if parent >= 0 else []) + [token])
    return paths + [[]] * (width - len(paths))
