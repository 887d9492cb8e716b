"""Drafters propose tokens for the target to verify; see `base.Drafter` for the contract."""

from specdec.drafters.base import (
    CatchesUp,
    Drafter,
    DrafterPowers,
    Learns,
    PassStates,
    ReportsCosts,
    UsesPrefixCache,
    WatchesTarget,
)
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.speculator import SpeculatorDrafter

__all__ = [
    "DraftModelDrafter",
    "Drafter",
    "DrafterPowers",
    "CatchesUp",
    "Learns",
    "ReportsCosts",
    "UsesPrefixCache",
    "WatchesTarget",
    "EagleDrafter",
    "NgramDrafter",
    "PassStates",
    "SpeculatorDrafter",
]
