"""Benchmark tables as accuracy or latency sources: `table:PATH:COLUMN`.

Rows are matched to architectures by the table's `arch` column (JSON, or any string
the space's `parse_arch` reads, e.g. NB201's `|op~0|+...|`) or `arch_str` column.
The `table:` syntax itself (`PREFIX`, `is_table`) belongs to the settings, in
`nasctl.config`, a layer below this one.
"""

from __future__ import annotations

import math
from pathlib import Path

from .config import TABLE_PREFIX as PREFIX
from .config import is_table  # noqa: F401 - for the modules that read tables
from .errors import UsageError
from .spaces.base import SearchSpace, arch_key


class MissingEntry(Exception):
    """The table has no value for an architecture."""


class ArchTable:
    def __init__(self, spec: str, space: SearchSpace, low: float = -math.inf, high: float = math.inf):
        """`low`..`high`: the values allowed in the column (an accuracy in %, a positive latency)."""
        path_col = spec.removeprefix(PREFIX)
        path, sep, column = path_col.rpartition(":")
        if not sep or not path or not column:
            raise UsageError(f"'{spec}' is not of the form table:PATH:COLUMN")
        self.path, self.column, self.spec = Path(path), column, spec
        if not self.path.is_file():
            raise UsageError(f"table '{path}' does not exist")
        import pandas as pd

        try:
            df = pd.read_csv(self.path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise UsageError(f"table '{path}' is not a readable CSV: {str(e).splitlines()[0]}") from None
        key_col = next((c for c in ("arch", "arch_str") if c in df.columns), None)
        if key_col is None:
            raise UsageError(f"table '{path}' has no 'arch' or 'arch_str' column")
        if column not in df.columns:
            allowed = ", ".join(c for c in df.columns if c != key_col)
            raise UsageError(f"table '{path}' has no column '{column}'; its columns: {allowed}")
        self.values: dict[str, float] = {}
        lines: dict[str, int] = {}
        for line, (text, value) in enumerate(zip(df[key_col], df[column]), start=2):
            where = f"table '{path}': line {line}"
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise UsageError(f"{where}: {column} '{value}' is not a number") from None
            if value != value:  # an empty cell is NaN: that architecture stays missing
                continue
            if not low <= value <= high or not math.isfinite(value):
                raise UsageError(f"{where}: {column} {value:g} is out of range; allowed: "
                                 + (f"{low:g} to {high:g}" if math.isfinite(high) else f"{low:g} or more"))
            try:
                key = arch_key(space.parse_arch(str(text)))
            except UsageError as e:
                raise UsageError(f"{where}: {e}") from None
            if key in self.values and self.values[key] != float(value):
                raise UsageError(f"{where}: the architecture of line {lines[key]} again, with another {column} "
                                 f"({float(value):g}, not {self.values[key]:g}); give each architecture once")
            self.values[key], lines[key] = float(value), line

    def lookup(self, key: str) -> float:
        try:
            return self.values[key]
        except KeyError:
            raise MissingEntry(f"{self.path.name} has no '{self.column}' for {key}") from None
