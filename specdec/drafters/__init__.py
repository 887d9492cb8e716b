"""Drafters propose tokens for the target to verify; see `base.Drafter` for the contract."""

from specdec.drafters.base import (
    CatchesUp,
    Drafter,
    DrafterPowers,
    Learns,
    PassStates,
    ReportsCosts,
    UsesPrefixCache,
    UsesProcessors,
    WatchesTarget,
)
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.mlp_heads import SpeculatorDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter, SuffixStore

__all__ = [
    "DraftModelDrafter",
    "Drafter",
    "DrafterPowers",
    "CatchesUp",
    "Learns",
    "ReportsCosts",
    "UsesPrefixCache",
    "UsesProcessors",
    "WatchesTarget",
    "EagleDrafter",
    "NgramDrafter",
    "PassStates",
    "SpeculatorDrafter",
    "SuffixDrafter",
    "SuffixStore",
]
