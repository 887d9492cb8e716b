"""`auto`'s costs and acceptance kept between processes, per machine and set-up, so a fresh
process does not spend its first steps re-measuring them (docs/design/auto.md, "Warm start")."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from specdec.window.costs import CostModel

log = logging.getLogger(__name__)


def cost_file(setup: dict) -> Path:
    """`$SPECDEC_HOME/costs/<machine>-<hash of the set-up>.json`."""
    from specdec.kernels.tuning import machine_id
    from specdec.paths import cache_root

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
