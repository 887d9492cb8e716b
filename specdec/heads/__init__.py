"""Trained MLP speculator heads (IBM's combined token/embedding speculator) and their
two-stage trainer. `model` holds the heads and their files; `train` the trainer."""

from specdec.heads.mlp import (
    MLPSpeculator,
    SpeculatorConfig,
    build_speculator,
    is_speculator_dir,
    load_speculator,
)

__all__ = [
    "MLPSpeculator",
    "SpeculatorConfig",
    "build_speculator",
    "is_speculator_dir",
    "load_speculator",
]
