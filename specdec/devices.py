"""Whether the device an engine is asked for exists here, checked before anything loads.

torch's own errors for a missing device (a CPU-only build's "Torch not compiled with CUDA
enabled", an index past the devices) surface deep inside the first load as tracebacks;
this says in one line what is wrong and where the fix is (docs/guide/gpu.md).
"""

from __future__ import annotations

import torch

from specdec.errors import InvalidParameterError

GUIDE = "see docs/guide/gpu.md"


def check_device(device: str | torch.device) -> None:
    """Refuse a device that is not "cpu" or "cuda[:N]", or a CUDA device this process has not
    got."""
    text = str(device)
    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise InvalidParameterError(f"device must be cpu or cuda[:N], got {text!r}") from None
    if parsed.type == "cpu":
        return
    if parsed.type != "cuda":
        raise InvalidParameterError(f"device must be cpu or cuda[:N], got {text!r}")
    if torch.version.cuda is None:
        raise InvalidParameterError(
            f"device {text}: this torch ({torch.__version__}) is a CPU-only build; install "
            f"a CUDA build of the same version ({GUIDE})"
        )
    count = torch.cuda.device_count()
    if count == 0:
        raise InvalidParameterError(
            f"device {text}: torch {torch.__version__} finds no CUDA device (a driver older "
            f"than CUDA {torch.version.cuda} needs, or CUDA_VISIBLE_DEVICES empty; {GUIDE})"
        )
    if parsed.index is not None and parsed.index >= count:
        raise InvalidParameterError(
            f"device {text}: there are {count} CUDA device(s) here, cuda:0..cuda:{count - 1}"
        )
