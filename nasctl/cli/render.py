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
