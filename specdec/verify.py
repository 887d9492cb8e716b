"""The verify pass: the target scores a row's last token and its drafts (a chain, or every
node of a tree) in one pass, the acceptor keeps a prefix plus one token, and the cache is
cut back to what was kept. Returns the verdict and the kept positions' states."""

from __future__ import annotations

import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler, Verdict
from specdec.drafters.base import PassStates
from specdec.heads.tree import TreeDraft, TreeWalkSampler
from specdec.logprobs import offer_logprobs
from specdec.processors import chain_paths, process_logits, tree_paths
from specdec.sampling import request_probs
from specdec.sequence import LiveSequence

# The chain acceptors that, for greedy rows (p one-hot), keep exactly the drafts that are
# the target's argmax and emit the argmax (RejectionSampler: u q(d) < p(d) holds iff p(d) = 1;
# its residual max(0, p - q) is then p): for all-greedy batches the engine runs `_GREEDY`
# on the logits in their place.
_ARGMAX_WHEN_GREEDY = (RejectionSampler, GreedyAcceptor)
_GREEDY = GreedyAcceptor()


def verify_chain(target, acceptor, live, cache, draft, params, generators, device, aux_layers=()):
    """k+1 positions per row in one pass; returns the verdict and the kept positions'
    states (the last committed token and the accepted drafts; with `aux_layers`, those
    layers' inputs at them too)."""
    B = len(live)
    last = torch.tensor([[s.output_ids[-1]] for s in live], device=device)
    start = cache.lengths[:B].clone()
    tokens = torch.cat([last, draft.tokens.to(device)], 1) if draft.k else last  # [B, k+1]
    out = target(tokens, cache, num_new=1 + draft.lengths, aux_layers=aux_layers)
    logits = processed(  # [B, k+1, V]
        live, out.logits, lambda: chain_paths(draft.tokens, draft.lengths.tolist())
    )
    target_probs = None
    if all(p.greedy for p in params) and type(acceptor) in _ARGMAX_WHEN_GREEDY:
        # p is one-hot at the argmax (and q at the draft token): both built-in lossless
        # acceptors keep a draft token while it is the argmax, then emit the argmax.
        # The logits' argmax says it without a [B, k+1, V] one-hot (measured on the
        # bf16 1.5B, k = 4: p and the rejection sampler 3.3 ms a step, this 1.8).
        verdict = _GREEDY(draft, logits, generators)
    else:
        target_probs = request_probs(logits, params)  # [B, k+1, V]
        verdict = acceptor(draft, target_probs, generators)
    if any(s.logprobs is not None for s in live):
        emitted = [row[: n + 1] for row, n in zip(*host_lists(verdict), strict=True)]
        positions = [range(len(row)) for row in emitted]
        offer_logprobs(live, logits, target_probs, positions, emitted)
    cache.truncate(start + 1 + verdict.num_accepted.cpu())
    return verdict, PassStates(tokens, out.hidden, 1 + verdict.num_accepted, aux=out.aux)


def verify_tree(
    target, tree_acceptor, live, cache, draft: TreeDraft, params, generators, device, aux_layers=()
):
    """The root (last committed token) and every tree node in one pass with a tree mask.

    Not in Algorithm 1: the tree acceptor (`TreeWalkSampler`: lossless, the argmax walk
    for greedy rows, recursive rejection sampling over the children for the others)
    picks each row's accepted path; its K/V move to consecutive slots and the cache is
    truncated to it.
    """
    B = len(live)
    last = torch.tensor([[s.output_ids[-1]] for s in live], device=device)
    start = cache.lengths[:B].clone()
    out = target(
        torch.cat([last, draft.tokens.to(device)], 1),
        cache,
        num_new=1 + draft.num_nodes,
        tree=draft.with_root(),
        aux_layers=aux_layers,
    )
    width = out.logits.shape[1]
    logits = processed(  # [B, 1+N, V]
        live,
        out.logits,
        lambda: [tree_paths(t.tokens, t.parents, width) for t in draft.trees],
    )
    greedy = [p.greedy for p in params]
    if all(greedy) and type(tree_acceptor) is TreeWalkSampler:
        probs = logits  # the walk takes only argmaxes: skip the softmax over 1+N rows
    else:
        probs = request_probs(logits, params)  # [B, 1+N, V]
    paths, nexts = tree_acceptor(draft.trees, probs, greedy, generators)
    d = max(len(path) for path in paths)
    index = torch.zeros(B, 1 + d, dtype=torch.long)  # [B, 1+d]: root, then path nodes
    tokens = torch.full((B, d + 1), -1, dtype=torch.long)  # the verdict's
    for b, (tree, path, nxt) in enumerate(zip(draft.trees, paths, nexts, strict=True)):
        index[b, 1 : 1 + len(path)] = 1 + torch.tensor(path, dtype=torch.long)
        tokens[b, : len(path) + 1] = torch.tensor([*(tree.tokens[n] for n in path), nxt])
    accepted = torch.tensor([len(path) for path in paths], dtype=torch.long)
    # Compact: the path's node at depth i moves to slot start + 1 + i.
    dst = start[:, None] + 1 + torch.arange(d)  # [B, d]
    on_path = torch.arange(d)[None, :] < accepted[:, None]
    cache.move_slots(torch.where(on_path, start[:, None] + index[:, 1:], dst), dst)
    cache.truncate(start + 1 + accepted)
    verdict = Verdict(tokens.to(device), accepted.to(device))
    if any(s.logprobs is not None for s in live):
        emitted = [row[: n + 1] for row, n in zip(*host_lists(verdict), strict=True)]
        positions = [index[b, : len(row)].tolist() for b, row in enumerate(emitted)]
        offer_logprobs(live, logits, None if probs is logits else probs, positions, emitted)
    H = out.hidden.shape[-1]
    kept = out.hidden.gather(1, index.to(device)[..., None].expand(-1, -1, H))  # [B, 1+d, H]
    aux = None  # [B, 1+d, k*H] the path's auxiliary states, where the target gives them
    if out.aux is not None:
        aux = out.aux.gather(1, index.to(device)[..., None].expand(-1, -1, out.aux.shape[-1]))
    path_tokens = torch.cat([last, tokens[:, :d].to(device)], 1)  # [B, 1+d]
    return verdict, PassStates(path_tokens, kept, 1 + accepted.to(device), aux=aux)


def processed(live: list[LiveSequence], logits: torch.Tensor, paths) -> torch.Tensor:
    """Not in Algorithm 1: the requests' logits processors (penalties, logit_bias,
    grammar masks; `specdec.processors`) on the target's `logits [B, T, V]`, position
    by position after the drafts before it (`paths()`, built only when a row has one)."""
    processors = [s.processor for s in live]
    if all(p is None for p in processors):
        return logits
    return process_logits(logits, processors, paths())


def host_lists(verdict: Verdict) -> tuple[list[list[int]], list[int]]:
    """A verdict's tokens and accepted counts as host lists."""
    return verdict.tokens.tolist(), verdict.num_accepted.tolist()
