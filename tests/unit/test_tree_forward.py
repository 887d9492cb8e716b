"""Tree verification in the native model: one tree-masked pass scores every node as if its
root-to-leaf path had been run as a chain, and compacting the cache to an accepted path
leaves it exactly as plain decoding of that path would."""

import pytest
import torch

from specdec.heads.tree import TokenTree, TreeDraft

from tiny import hf_tiny, native_from_hf

PROMPTS = [[5, 17, 42, 8, 9, 10, 11, 12, 13], [60, 3, 3], [33, 34, 35, 36, 1]]
TREES = [
    [(1, 2, 3), (1, 2, 4), (1, 5, 6), (7, 8), (1, 2)],
    [(40, 41), (42,)],
    [(3, 3, 3), (3, 4, 5), (9, 9, 9)],
]


@pytest.fixture(
    scope="module",
    params=[("llama", {}), ("qwen2", {}), ("mistral", {"sliding_window": 8})],
    ids=["llama", "qwen2", "mistral-window8"],
)
def model(request):
    kind, overrides = request.param
    return native_from_hf(hf_tiny(kind, **overrides))


def _prefill(model, prompts):
    from specdec.models.transformer import right_pad

    cache = model.new_cache(len(prompts), 64)
    tokens, lengths = right_pad([p[:-1] for p in prompts])
    model(tokens, cache, num_new=lengths)
    return cache


def _chain_logits(model, prompt, tokens):
    """Logits `[1 + len(tokens), V]` of the last prompt token and `tokens`, as a chain."""
    cache = _prefill(model, [prompt])
    return model(torch.tensor([[prompt[-1], *tokens]]), cache).logits[0]


@torch.inference_mode()
def test_tree_pass_equals_each_path_as_a_chain(model):
    trees = [TokenTree.from_paths(t) for t in TREES]
    draft = TreeDraft.from_trees(trees)
    cache = _prefill(model, PROMPTS)
    roots = torch.tensor([[p[-1]] for p in PROMPTS])
    out = model(
        torch.cat([roots, draft.tokens], 1),
        cache,
        num_new=1 + draft.num_nodes,
        tree=draft.with_root(),
    )
    for b, (prompt, tree) in enumerate(zip(PROMPTS, trees, strict=True)):
        for path in tree.paths:
            chain = _chain_logits(model, prompt, [tree.tokens[n] for n in path])
            got = out.logits[b, [0, *(1 + n for n in path)]]
            torch.testing.assert_close(got, chain, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_compacted_cache_continues_like_plain_decoding(model):
    trees = [TokenTree.from_paths(t) for t in TREES]
    draft = TreeDraft.from_trees(trees)
    cache = _prefill(model, PROMPTS)
    start = cache.lengths[:3].clone()
    roots = torch.tensor([[p[-1]] for p in PROMPTS])
    model(
        torch.cat([roots, draft.tokens], 1),
        cache,
        num_new=1 + draft.num_nodes,
        tree=draft.with_root(),
    )
    # Ragged accepted paths: row 0 keeps (1, 5, 6), row 1 (42,), row 2 nothing.
    kept = [[0, 4, 5], [2], []]
    m = max(len(k) for k in kept)
    src = torch.zeros(3, m, dtype=torch.long)
    dst = torch.zeros(3, m, dtype=torch.long)
    for b, nodes in enumerate(kept):
        d = start[b] + 1 + torch.arange(m)
        dst[b] = d
        src[b] = d
        src[b, : len(nodes)] = start[b] + 1 + torch.tensor(nodes, dtype=torch.long)
    cache.move_slots(src, dst)
    cache.truncate(start + 1 + torch.tensor([len(k) for k in kept]))
    # Continue decoding three more tokens on the compacted cache ...
    extra = torch.tensor([[50, 51, 52]] * 3)
    got = model(extra, cache).logits
    # ... and compare with plain decoding of prompt + accepted path + the same tokens.
    for b, (prompt, nodes) in enumerate(zip(PROMPTS, kept, strict=True)):
        path = [trees[b].tokens[n] for n in nodes]
        plain = _chain_logits(model, prompt, [*path, 50, 51, 52])[-3:]
        torch.testing.assert_close(got[b], plain, atol=1e-5, rtol=1e-5)
