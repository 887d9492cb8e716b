"""Tensor parallelism over torch.distributed (gloo on CPU, NCCL on CUDA), launched by
torchrun: `group` (set-up, collectives, failures), `sharding` (the Megatron-style split of
the native transformer), `spmd` (what rank 0 decides for all ranks)."""

from specdec.distributed.group import (
    TPGroup,
    current,
    init_tensor_parallel,
    reports_failures,
    tensor_parallel,
)
from specdec.distributed.sharding import (
    build_sharded_transformer,
    check_divisible,
    check_tp_split,
)
from specdec.distributed.spmd import SharedWindow, shared_seeds, shared_window

__all__ = [
    "SharedWindow",
    "TPGroup",
    "build_sharded_transformer",
    "check_divisible",
    "check_tp_split",
    "current",
    "init_tensor_parallel",
    "reports_failures",
    "shared_seeds",
    "shared_window",
    "tensor_parallel",
]
