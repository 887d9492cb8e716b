"""A group's finished turns on disk, so a stopped sweep resumes at the group's next turn.

The methods of a group take turns (`Runner.measure_group`), and a row is only written once
every turn has run. At 1,024-token prompts on a 2-core CPU one group ran for over half an
hour, and a session that stopped it kept nothing. So after every turn the runs so
far go to `<out>/turns/<group>.json`, and a resumed sweep starts the group at its next turn.
The file is removed once the group's rows are in results.json.

The log lives in the results folder, whose configuration `ResultStore` already checks
(models, lengths, tokens, prompts), so its runs were measured with the same settings; it
also names the group's methods, and a run with other methods starts the group afresh.
Each turn's runs were taken together, so pairing a method's run with plain's of the same
turn (`analysis`) stays within one process's minutes across a resume.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.results import write_atomic
from specdec.stats import SpecStats

log = logging.getLogger(__name__)


@dataclass
class Turns:
    """What a group's finished turns left: `done` turns, the start stamp of the turns, each
    point's runs (`Trial.runs` entries) and the messages of points whose runs failed, by
    point key, and what warm-start points carry from their last run (`Runner._carried`)."""

    done: int
    started: str | None
    runs: dict[str, list[tuple]]
    errors: dict[str, str]
    carried: dict[str, dict]


class TurnLog:
    """The turn file of one group of points, in the results folder `folder`."""

    def __init__(self, folder: Path, group: str, methods: list[str]) -> None:
        self.methods = sorted(methods)
        self.path = Path(folder) / "turns" / f"{re.sub(r'[^A-Za-z0-9.=_-]+', '_', group)}.json"

    def load(self) -> Turns | None:
        """The turns saved for this group, or None (none saved, other methods, unreadable)."""
        if not self.path.is_file():
            return None
        try:
            data = json.loads(self.path.read_text())
            if data["methods"] != self.methods:
                return None
            turns = Turns(
                done=int(data["done"]),
                started=data["started"],
                runs={key: [_run_from_json(r) for r in rs] for key, rs in data["runs"].items()},
                errors=dict(data["errors"]),
                carried=dict(data["carried"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("specdec bench: starting %s afresh (unreadable: %s)", self.path, err)
            return None
        if any(len(rs) != turns.done for rs in turns.runs.values()):
            log.warning("specdec bench: starting %s afresh (runs of unequal turns)", self.path.name)
            return None
        return turns

    def save(self, turns: Turns) -> None:
        """Write `turns` in place of the last (atomically: a process killed mid-write
        leaves the previous turns whole)."""
        data = {
            "methods": self.methods,
            "done": turns.done,
            "started": turns.started,
            "runs": {key: [_run_to_json(r) for r in rs] for key, rs in turns.runs.items()},
            "errors": turns.errors,
            "carried": turns.carried,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(data))

    def clear(self) -> None:
        """Remove the file: the group's rows are written."""
        self.path.unlink(missing_ok=True)


def _run_to_json(run: tuple) -> list:
    """A `Trial.runs` entry (wall s, CPU s, token ids, stats per request or None, prefill s)."""
    wall, cpu, token_ids, stats, prefill_s = run
    stats = None if stats is None else [dataclasses.asdict(s) for s in stats]
    return [wall, cpu, token_ids, stats, prefill_s]


def _run_from_json(entry: list) -> tuple:
    wall, cpu, token_ids, stats, prefill_s = entry
    stats = None if stats is None else [SpecStats(**s) for s in stats]
    return (float(wall), float(cpu), token_ids, stats, float(prefill_s))
