"""Drafters propose tokens for the target to verify; see `base.Drafter` for the contract."""

from specdec.drafters.base import Drafter, DrafterBase, PassStates
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.mlp_heads import SpeculatorDrafter
from specdec.drafters.ngram import NgramDrafter

__all__ = [
    "DraftModelDrafter",
    "Drafter",
    "DrafterBase",
    "EagleDrafter",
    "NgramDrafter",
    "PassStates",
    "SpeculatorDrafter",
]
