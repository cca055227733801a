"""Run folders: config.yaml, trials.csv (written as each trial finishes), pareto.csv."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from . import __version__, workspace
from .errors import UsageError

# Columns that measure time: they differ between otherwise identical runs.
TIMING_COLUMNS = ("train_s",)


def _cell(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, ".6g")
    return "" if value is None else str(value)


class RunStore:
    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = list(columns)

    @classmethod
    def create(cls, run_dir: Path | None, run_id: str, columns: Sequence[str]) -> "RunStore":
        if run_dir is None:
            base = workspace.runs_folder()
            run_dir = base / run_id
            n = 1
            while run_dir.exists():
                n += 1
                run_dir = base / f"{run_id}-{n}"
        elif (run_dir / "trials.csv").exists():
            raise UsageError(f"run folder '{run_dir}' already holds a run (trials.csv); choose another --run-dir")
        run_dir.mkdir(parents=True, exist_ok=True)
        store = cls(run_dir, columns)
        with open(store.trials_path, "w", newline="") as f:
            csv.writer(f).writerow(store.columns)
        return store

    @property
    def trials_path(self) -> Path:
        return self.path / "trials.csv"

    def write_config(self, config: Mapping) -> None:
        doc = {"nasctl_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **config}
        (self.path / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def append(self, row: Mapping) -> None:
        """Add one finished trial; the file is flushed so a crash loses nothing finished."""
        with open(self.trials_path, "a", newline="") as f:
            csv.writer(f).writerow([_cell(row.get(c)) for c in self.columns])

    def write_pareto(self, rows: Sequence[Mapping]) -> Path:
        path = self.path / "pareto.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            for row in rows:
                w.writerow([_cell(row.get(c)) for c in self.columns])
        return path
