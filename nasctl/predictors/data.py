"""Training and evaluation data: architectures with measured values.

A data source is a CSV file with an `arch` (or `arch_str`) column - JSON knob values,
or any text the space's `parse_arch` reads, such as NB201's `|op~0|+...|` strings - and
one column per target; a run folder (its trials.csv); or `table:PATH:COLUMN`, a CSV
whose COLUMN is the target.  Rows whose target cells are all empty are left out (a
failed measurement); any other empty or non-numeric target cell is an error."""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import UsageError
from ..spaces.base import SearchSpace, arch_key
from ..specs import unique_columns
from ..tables import PREFIX, is_table

KEY_COLUMNS = ("arch", "arch_str")


@dataclass
class Data:
    source: str
    texts: list[str]          # each row's architecture as the source wrote it
    archs: list[dict]
    targets: list[str]        # target column names ([] when none were asked for)
    Y: np.ndarray | None      # (rows, targets)
    skipped: int = 0          # rows left out for empty targets

    def digest(self) -> str:
        """SHA-256 of the rows as architectures and values, whatever the file's layout."""
        h = hashlib.sha256()
        for i, arch in enumerate(self.archs):
            values = [] if self.Y is None else [repr(float(v)) for v in self.Y[i]]
            h.update((arch_key(arch) + "," + ",".join(values) + "\n").encode())
        return h.hexdigest()

    def card(self) -> dict:
        return {"source": self.source, "rows": len(self.archs), "sha256": self.digest()}


def read(source: str, space: SearchSpace, targets: Sequence[str] = ()) -> Data:
    """The rows of `source` for `space`, with the `targets` columns (none: architectures only)."""
    import pandas as pd

    targets = list(targets)
    path = Path(source)
    if is_table(source):
        path_text, sep, column = source.removeprefix(PREFIX).rpartition(":")
        if not sep or not path_text or not column:
            raise UsageError(f"'{source}' is not of the form table:PATH:COLUMN")
        if targets and targets != [column]:
            raise UsageError(f"data '{source}' names target '{column}' but --target is '{','.join(targets)}'")
        path, targets = Path(path_text), [column]
    elif path.is_dir():
        if not (path / "trials.csv").is_file():
            raise UsageError(f"data folder '{source}' is not a run folder: it holds no trials.csv")
        path = path / "trials.csv"
    if not path.is_file():
        raise UsageError(f"data file '{path}' does not exist")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
        with path.open(encoding="utf-8", newline="") as f:
            header = next(csv.reader(f), [])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UsageError(f"data '{path}' is not a readable CSV: {str(e).splitlines()[0]}") from None
    unique_columns(f"data '{path}'", header)
    key = next((c for c in KEY_COLUMNS if c in df.columns), None)
    if key is None:
        raise UsageError(f"data '{path}' has no 'arch' or 'arch_str' column")
    missing = [t for t in targets if t not in df.columns]
    if missing:
        allowed = ", ".join(c for c in df.columns if c != key)
        raise UsageError(f"data '{path}' has no column '{missing[0]}'; its columns: {allowed}")
    cells = df[targets].to_numpy() if targets else np.zeros((len(df), 0), dtype=str)
    keep = [i for i in range(len(df)) if not targets or any(c.strip() for c in cells[i])]
    archs, texts, values = [], [], []
    for i in keep:
        line = i + 2  # header is line 1
        text = df[key].iloc[i]
        try:
            archs.append(space.parse_arch(text))
        except UsageError as e:
            raise UsageError(f"data '{path}' line {line}: {e}") from None
        texts.append(text)
        row = []
        for t, cell in zip(targets, cells[i]):
            try:
                row.append(float(cell))
            except ValueError:
                raise UsageError(f"data '{path}' line {line}: {t} '{cell}' is not a number") from None
        values.append(row)
    Y = np.array(values, dtype=float).reshape(len(keep), len(targets)) if targets else None
    if Y is not None and not np.isfinite(Y).all():
        line = int(np.argwhere(~np.isfinite(Y))[0, 0])
        raise UsageError(f"data '{path}' line {keep[line] + 2}: a target value is not a finite number")
    return Data(source, texts, archs, targets, Y, skipped=len(df) - len(keep))
