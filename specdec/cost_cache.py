"""`auto`'s measured costs kept between processes, per machine and model set-up.

A fresh process used to spend its first steps measuring what the last one already knew (a
plain step, a verify pass per window width, the draft step, the prefill), and a
`specdec generate` per prompt paid it every time: 15.9 / 10.5 tok/s (code / chat) where
the same prompts in one warm process ran 19.1 / 13.5. The costs are stored as JSON under
`$SPECDEC_HOME/costs/<machine>-<set-up>.json`, where the set-up names everything that
changes them (target, draft, weight formats, dtype, device, tensor parallelism), and keep
being updated as running averages from there.

The window's acceptance is stored beside them, as a weak prior (`AdaptiveWindow.
acceptance_state`): it belongs to the workload more than to the set-up, but a fresh
process that starts from the generic prior has to look before it drafts, which costs a
short request its catch-up when the drafter is poor and its whole gain when the drafter is
good and the look is refused; starting from the last run's acceptance, a process drafts at
once where that paid and not at all where it did not, and its own steps outweigh the
prior within a few.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from specdec.cost_model import CostModel

log = logging.getLogger(__name__)


def cost_file(setup: dict) -> Path:
    from specdec.hub import cache_root
    from specdec.kernels.tuning import machine_id

    key = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "costs" / f"{machine_id()}-{key}.json"


def load_costs(path: Path) -> CostModel | None:
    """The stored costs, or None (none yet, or unreadable: then measured afresh)."""
    try:
        return CostModel.from_json(json.loads(path.read_text())["costs"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("specdec: ignoring unreadable cost cache %s (%s)", path, err)
        return None


def load_acceptance(path: Path) -> dict | None:
    """The stored acceptance counts (`AdaptiveWindow.start_from`), or None."""
    try:
        state = json.loads(path.read_text()).get("acceptance")
    except (OSError, ValueError, AttributeError):
        return None
    return state if isinstance(state, dict) else None


def save_costs(path: Path, costs: CostModel, setup: dict, acceptance: dict | None = None) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        stored = {"setup": setup, "costs": costs.to_json(), "acceptance": acceptance}
        tmp.write_text(json.dumps(stored))
        tmp.replace(path)
    except OSError as err:  # a read-only cache must not stop generation
        log.warning("specdec: cannot save costs to %s (%s)", path, err)
