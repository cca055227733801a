"""Shared terminal output: stdout for results, stderr for progress and messages."""

from __future__ import annotations

import json
import sys

from rich.console import Console

out = Console()
err = Console(stderr=True)


def print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
