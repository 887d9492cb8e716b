"""Stage-2 continuations on disk: the target's own answers with the states the heads read,
written by the trainer (`training.stages`) under a heads directory's `stage2/` and replayed
from there by `serve --learn` (`training.online`)."""

from __future__ import annotations

from pathlib import Path

import torch

STAGE2 = "stage2"  # the heads directory's cache of stage-2 continuations and states


def save_stage2_segments(file: Path, segments) -> None:
    """Write (tokens [S], states [S, E]) pairs as one chunk (whole, or not at all)."""
    from safetensors.torch import save_file

    tensors = {}
    for j, (tokens, states) in enumerate(segments):
        tensors[f"tokens.{j}"] = tokens
        tensors[f"hidden.{j}"] = states.cpu().contiguous()  # the target's dtype
    save_file(tensors, str(file.with_suffix(".tmp")))
    file.with_suffix(".tmp").rename(file)


def stage2_segments(file: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One chunk of cached stage-2 continuations: (tokens [S], states [S, E]) pairs (the
    last prompt token and the continuation; E: what the heads read). Also what
    `serve --learn` replays from a trained head's directory (`training.online`)."""
    from safetensors.torch import load_file

    loaded = load_file(str(file))
    count = sum(k.startswith("tokens.") for k in loaded)
    return [(loaded[f"tokens.{j}"], loaded[f"hidden.{j}"]) for j in range(count)]


def pad_segments(segments, min_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage-2 segments as one batch: states [B, S, E], tokens [B, S], valid [B, S]."""
    S = max(min_len, *(len(t) for t, _ in segments))
    E = segments[0][1].shape[1]
    hidden = torch.zeros(len(segments), S, E)
    tokens = torch.zeros(len(segments), S, dtype=torch.long)
    valid = torch.zeros(len(segments), S, dtype=torch.bool)
    for b, (t, h) in enumerate(segments):
        hidden[b, : len(t)], tokens[b, : len(t)], valid[b, 1 : len(t)] = h, t, True
    return hidden.to(device), tokens.to(device), valid.to(device)
