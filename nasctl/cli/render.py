"""Shared terminal output: stdout for results, stderr for progress and messages."""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console

out = Console()
if not out.is_terminal and "COLUMNS" not in os.environ:
    # A terminal wraps tables to its width; pipes and files (CI logs) get whole rows
    # instead of columns cut to rich's default 80 characters.
    out = Console(width=200)
err = Console(stderr=True)


def print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def print_rows(rows: list[dict], columns: dict[str, str], as_json: bool) -> None:
    """Rows as JSON (a list) or as a table: `columns` maps each key to its heading."""
    if as_json:
        return print_json(rows)
    from rich.table import Table

    table = Table(*columns.values())
    for r in rows:
        table.add_row(*(str(r[k]) for k in columns))
    out.print(table)
