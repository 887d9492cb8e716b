"""results.json / results.csv: written after every point, read back to resume.

results.json holds `config` (what the numbers depend on: models, dtype, device, lengths),
`costs` (the measured verify curve and draft cost per batch size and context) and `rows`
(one per point, keyed by `Point.key`). A resumed run skips every point with an "ok" row;
skipped points (a peer not installed) are tried again. A run with another config refuses
the folder rather than mixing numbers that cannot be compared.

Writes go to a temporary file renamed into place, so a run killed mid-write leaves the
previous results.json whole.

Under tensor parallelism rank 0 alone reads and writes the folder; the other ranks hold a
`replica` of its store (its rows and costs, broadcast), so they resume, skip and measure
exactly the points rank 0 does, and write nothing.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from specdec.errors import InvalidParameterError

# CSV columns, in order; lists (acceptance per position) are joined with spaces.
CSV_COLUMNS = (
    "workload",
    "prompt_len",
    "prompt_tokens_mean",
    "batch",
    "temperature",
    "method",
    "peer_dtype",  # a peer's own dtype where it differs (vLLM in fp32 on a CPU without bf16)
    "tp",
    "status",
    "requests",
    "generated_tokens",
    "wall_s",
    "tokens_per_s",
    "speedup",
    "paired_speedup",
    "decode_speedup",
    "paired_decode_speedup",
    "cpu_speedup",
    "paired_cpu_speedup",
    "request_speedup",
    "request_speedup_low",
    "request_speedup_high",
    "predicted_speedup",
    "predicted_from_tokens_per_pass",
    "predicted_best_k",
    "tpot_median_s",
    "tpot_p90_s",
    "ttft_median_s",
    "ttft_p90_s",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_per_position",
    "same_output_as_plain",
    "cost_per_million_tokens",
    "peak_rss_mb",
    "load_1m",
    "threads_scaling",
    "reason",
)


class ResultStore:
    def __init__(self, out_dir: Path, config: dict, writes: bool = True) -> None:
        self.dir = Path(out_dir)
        self.path = self.dir / "results.json"
        self.config = config
        self.writes = writes
        self.costs: dict[str, dict] = {}
        self.rows: dict[str, dict] = {}
        if writes and self.path.is_file():
            data = json.loads(self.path.read_text())
            if data.get("config") != config:
                raise InvalidParameterError(
                    f"{self.path} was measured with another configuration "
                    f"({_diff(data.get('config') or {}, config)}): use another --out folder"
                )
            self.costs = data.get("costs", {})
            self.rows = {row["key"]: row for row in data.get("rows", [])}

    @classmethod
    def replica(cls, out_dir: Path, config: dict, costs: dict, rows: dict) -> ResultStore:
        """A store holding another rank's `costs` and `rows` that never touches the disk."""
        store = cls(out_dir, config, writes=False)
        store.costs, store.rows = costs, rows
        return store

    def merge(self, other_dir: Path) -> int:
        """Take in the rows and costs of another folder measured with the same config
        (slices of one sweep run side by side, one process per core, each into its own
        folder: two processes must never write one results.json). Rows this store already
        holds as "ok" win. Returns how many rows were taken."""
        path = Path(other_dir) / "results.json"
        if not path.is_file():
            raise InvalidParameterError(f"--merge {other_dir}: no results.json there")
        data = json.loads(path.read_text())
        if data.get("config") != self.config:
            raise InvalidParameterError(
                f"--merge {other_dir} was measured with another configuration "
                f"({_diff(data.get('config') or {}, self.config)}): it cannot be mixed in"
            )
        for key, entry in data.get("costs", {}).items():
            self.costs.setdefault(key, entry)
        taken = 0
        for row in data.get("rows", []):
            if not self.done(row["key"]):
                self.rows[row["key"]] = row
                taken += 1
        return taken

    def done(self, key: str) -> bool:
        row = self.rows.get(key)
        return row is not None and row.get("status") == "ok"

    def add(self, row: dict) -> None:
        self.rows[row["key"]] = row

    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows.values() if r.get("status") == "ok"]

    def save(self, extra: dict | None = None) -> None:
        if not self.writes:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {"config": self.config, **(extra or {}), "costs": self.costs}
        data["rows"] = list(self.rows.values())
        write_atomic(self.path, json.dumps(data, indent=1))
        write_atomic(self.dir / "results.csv", _csv(data["rows"]))


def _diff(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys)


def _csv(rows: list[dict]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        cells = []
        for column in CSV_COLUMNS:
            value = row.get(column)
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            cells.append("" if value is None else value)
        writer.writerow(cells)
    return buffer.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed into place: a process killed
    mid-write leaves the previous file whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
