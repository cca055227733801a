"""Benchmark tables as accuracy or latency sources: `table:PATH:COLUMN`.

Rows are matched to architectures by the table's `arch` column (JSON, or any string
the space's `parse_arch` reads, e.g. NB201's `|op~0|+...|`) or `arch_str` column.
The `table:` syntax itself (`PREFIX`, `is_table`) belongs to the settings, in
`nasctl.config`, a layer below this one.
"""

from __future__ import annotations

from pathlib import Path

from .config import TABLE_PREFIX as PREFIX
from .config import is_table  # noqa: F401 - for the modules that read tables
from .errors import UsageError
from .spaces.base import SearchSpace, arch_key


class MissingEntry(Exception):
    """The table has no value for an architecture."""


class ArchTable:
    def __init__(self, spec: str, space: SearchSpace):
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
        for text, value in zip(df[key_col], df[column]):
            if value == value:  # an empty cell is NaN: that architecture stays missing
                self.values[arch_key(space.parse_arch(str(text)))] = float(value)

    def lookup(self, key: str) -> float:
        try:
            return self.values[key]
        except KeyError:
            raise MissingEntry(f"{self.path.name} has no '{self.column}' for {key}") from None
