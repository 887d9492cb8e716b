"""The window: how many tokens to draft each step (docs/design/auto.md).

`FixedWindow` drafts K; `AdaptiveWindow` (`auto`) picks the k that maximises expected
tokens over measured seconds, k = 0 being plain decoding, and guards the speed it realises.
"""

from specdec.window.config import WindowConfig
from specdec.window.controller import AdaptiveWindow, FixedWindow, Phase, PricesModels, Window
from specdec.window.costs import CostModel, conditional_acceptance, expected_tokens, predict_speedup
from specdec.window.pricing import startup_pays

__all__ = [
    "AdaptiveWindow",
    "CostModel",
    "FixedWindow",
    "Phase",
    "PricesModels",
    "Window",
    "WindowConfig",
    "conditional_acceptance",
    "expected_tokens",
    "predict_speedup",
    "startup_pays",
]
