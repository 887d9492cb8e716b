"""Candidate trees: selection, prefix merging and flattening on hand-built examples."""

import torch

from specdec.heads.tree import TokenTree, TreeDraft, greedy_walk, select_paths

PATHS = [(1, 2, 3), (1, 2, 4), (1, 5, 6), (7, 8), (1, 2)]


def test_select_paths_keeps_the_best_by_summed_log_prob():
    paths = torch.tensor([[1, 2], [1, 3], [4, 2], [4, 3]])
    scores = torch.tensor([-1.0, -0.5, -3.0, -0.5])
    assert select_paths(paths, scores, 3) == [(1, 3), (4, 3), (1, 2)]  # ties: enumeration order
    assert select_paths(paths, scores, 10) == [(1, 3), (4, 3), (1, 2), (4, 2)]


def test_merge_shared_prefixes_and_flatten():
    tree = TokenTree.from_paths(PATHS)
    assert tree.tokens == (1, 2, 3, 4, 5, 6, 7, 8)
    assert tree.parents == (-1, 0, 1, 1, 0, 4, -1, 6)
    assert tree.depth == (0, 1, 2, 2, 1, 2, 0, 1)
    # (1, 2) is a prefix of (1, 2, 3): not a leaf, no path of its own.
    assert tree.paths == ((0, 1, 2), (0, 1, 3), (0, 4, 5), (6, 7))
    assert tree.max_depth == 3
    expected = torch.zeros(8, 8, dtype=torch.bool)
    for i, ancestors in enumerate([[], [0], [0, 1], [0, 1], [0], [0, 4], [], [6]]):
        expected[i, [i, *ancestors]] = True
    assert torch.equal(tree.mask(), expected)


def test_truncate_and_best_chain():
    tree = TokenTree.from_paths(PATHS)
    cut = tree.truncated(2)
    assert cut.tokens == (1, 2, 5, 7, 8)
    assert cut.parents == (-1, 0, 0, -1, 3)
    assert cut.paths == ((0, 1), (0, 2), (3, 4))
    assert tree.truncated(0).num_nodes == 0
    chain = tree.best_chain()
    assert chain.tokens == (1, 2, 3) and chain.parents == (-1, 0, 1) and chain.paths == ((0, 1, 2),)


def test_batch_pads_to_the_widest_tree():
    small = TokenTree.chain([9, 9])
    draft = TreeDraft.from_trees([TokenTree.from_paths(PATHS), small])
    assert draft.tokens.shape == (2, 8)
    assert draft.num_nodes.tolist() == [8, 2]
    assert draft.lengths.tolist() == [3, 2]
    assert draft.tokens[1].tolist() == [9, 9, 0, 0, 0, 0, 0, 0]
    assert draft.parents[1].tolist() == [-1, 0, -1, -1, -1, -1, -1, -1]
    # Pad nodes see only themselves.
    assert torch.equal(draft.mask[1, 2:, :], torch.eye(8, dtype=torch.bool)[2:])
    offsets, visible = draft.with_root()
    assert offsets[0].tolist() == [0, 1, 2, 3, 3, 2, 3, 1, 2]
    assert offsets[1, :3].tolist() == [0, 1, 2]
    assert visible[0, 0].tolist() == [True] + [False] * 8  # the root sees itself
    assert visible[0, 6].nonzero().flatten().tolist() == [0, 1, 5, 6]  # root, 1, 5, 6
    assert visible[1, 3].nonzero().flatten().tolist() == [3]  # a pad node: itself only


def test_greedy_walk_takes_the_matching_child_at_every_level():
    tree = TokenTree.from_paths(PATHS)
    # best[0]: argmax at the root, best[1 + i]: at node i.
    best = [1, 5, 0, 0, 0, 6, 0, 0, 0]  # 1, then 5 (not the first child), then 6
    assert greedy_walk(tree, best) == [0, 4, 5]
    assert greedy_walk(tree, [7, 0, 0, 0, 0, 0, 0, 3, 0]) == [6]  # 7 then a miss
    assert greedy_walk(tree, [4] + [0] * 8) == []
    assert greedy_walk(TokenTree.from_paths([]), [3]) == []
