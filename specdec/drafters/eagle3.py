"""An EAGLE-3 head (`specdec.heads.eagle3`) as a drafter: the eagle drafter's chains,
trees, catch-up and prefix store (`specdec.drafters.eagle`), over the target's auxiliary
states rather than its final ones.

The target hands those over from the passes it runs anyway: `attach_aux_layers` sets the
target's `aux_layers` to the head's ids, and every pass's `PassStates.aux` then holds the
inputs of those layers at the kept positions (`[B, T, 3H]`). A target without them (the
fixed-shape passes of `specdec.graphs.static_pass`, which keep no layer inputs) is refused
at the first pass rather than drafted from something else.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import PassStates
from specdec.drafters.eagle import EagleDrafter
from specdec.errors import IncompatibleDraftError, UnsupportedModelError
from specdec.heads.eagle3 import Eagle3Head, check_aux_layers


def attach_aux_layers(target, head: Eagle3Head) -> None:
    """Have `target`'s passes return the inputs of the head's layers. A target already
    serving another set of layers is refused (one target, one set)."""
    ids = tuple(head.config.aux_layer_ids)
    check_aux_layers(ids, target.config.num_layers)
    current = getattr(target, "aux_layers", ())
    if current and tuple(current) != ids:
        raise IncompatibleDraftError(
            f"the target already hands over layers {list(current)}; this eagle3 head reads "
            f"{list(ids)}"
        )
    target.aux_layers = ids


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

    def _features(self, states: PassStates) -> torch.Tensor:
        """`[B, T, 3H]`: the target's auxiliary states at the kept positions."""
        want = self.head.feature_size
        if states.aux is None or states.aux.shape[-1] != want:
            got = "none" if states.aux is None else f"width {states.aux.shape[-1]}"
            layers = list(self.head.config.aux_layer_ids)
            raise UnsupportedModelError(
                f"an eagle3 head needs the target's layer inputs {layers} (width {want})"
                f" from every pass, got {got}: attach them with "
                "`attach_aux_layers` and run the target's eager passes (no static passes)"
            )
        return states.aux
