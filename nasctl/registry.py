"""A small strict registry of named implementations.

Entries are "module:attribute" paths imported on first use, so listing or resolving a
name never pays for heavy imports it does not need.  Duplicate names are refused and a
lookup of an unknown name raises a one-line :class:`UsageError` naming the registry and
what it holds.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import UsageError


class Registry:
    def __init__(self, what: str):
        self.what = what  # e.g. "strategy", used in error messages
        self._paths: dict[str, str] = {}

    def register(self, name: str, path: str) -> None:
        if name in self._paths:
            raise ValueError(f"{self.what} '{name}' is already registered ({self._paths[name]})")
        self._paths[name] = path

    def names(self) -> list[str]:
        return sorted(self._paths)

    def __contains__(self, name: str) -> bool:
        return name in self._paths

    def get(self, name: str) -> Any:
        try:
            path = self._paths[name]
        except KeyError:
            raise UsageError(f"unknown {self.what} '{name}'; allowed: {', '.join(self.names())}") from None
        module, _, attr = path.partition(":")
        return getattr(importlib.import_module(module), attr)
