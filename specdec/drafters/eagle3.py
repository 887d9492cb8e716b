"""An EAGLE-3 head (`specdec.heads.eagle3`) as a drafter: the eagle drafter's chains,
trees, catch-up and prefix store (`specdec.drafters.eagle`), over the target's auxiliary
states rather than its final ones.

The target hands those over from the passes it runs anyway: the drafter names the head's
layers (`aux_layers`, the `ReadsLayerInputs` power), the engine asks each target pass for
their inputs, and `PassStates.aux` holds them at the kept positions (`[B, T, 3H]`). The
fixed-shape passes of `specdec.graphs.static_pass` keep no layer inputs: they refuse such a
pass rather than hand over something else.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import PassStates
from specdec.drafters.eagle import EagleDrafter
from specdec.errors import UnsupportedModelError
from specdec.heads.eagle3 import Eagle3Head


class Eagle3Drafter(EagleDrafter):
    def __init__(
        self,
        head: Eagle3Head,
        max_batch: int,
        max_len: int,
        tree: Sequence[int] | None = None,
        n_candidates: int | None = None,
        sampled_tree: bool = True,
        learner=None,
    ) -> None:
        super().__init__(head, max_batch, max_len, tree, n_candidates, sampled_tree, learner)
        self.aux_layers = tuple(head.config.aux_layer_ids)  # ReadsLayerInputs

    def _features(self, states: PassStates) -> torch.Tensor:
        """`[B, T, 3H]`: the target's auxiliary states at the kept positions."""
        want = self.head.feature_size
        if states.aux is None or states.aux.shape[-1] != want:
            got = "none" if states.aux is None else f"width {states.aux.shape[-1]}"
            layers = list(self.head.config.aux_layer_ids)
            raise UnsupportedModelError(
                f"an eagle3 head needs the target's layer inputs {layers} (width {want})"
                f" from every pass, got {got}: the engine asks for them (`aux_layers`) in"
                " the target's eager passes (no static passes)"
            )
        return states.aux
