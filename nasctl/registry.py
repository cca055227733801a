"""A small strict registry of named implementations, open to plugins.

Entries are "module:attribute" paths imported on first use, so listing or resolving a
name never pays for heavy imports it does not need.  Duplicate names are refused and a
lookup of an unknown name raises a one-line :class:`UsageError` naming the registry and
what it holds.

Other installed packages add entries through entry points: a registry made with a
`group` (e.g. `nasctl.space_kinds`) reads that group on its first use (`names`, `get`,
`in`), after the built-in entries.  A plugin's entry is not imported until it is used;
one whose name a built-in already has is refused with a one-line warning on stderr (the
built-in wins), and one that fails to import is a one-line error when it is used, never a
traceback.  Each entry knows where it comes from: "built-in", or the distribution's name
and version.
"""

from __future__ import annotations

import importlib
import sys
import weakref
from dataclasses import dataclass
from typing import Any

from .errors import UsageError

BUILT_IN = "built-in"

_entry_points: dict[str, list[tuple[str, str, str]]] | None = None  # group -> [(name, value, origin)]
_registries: weakref.WeakSet = weakref.WeakSet()
_warned: set[str] = set()


def warn(message: str) -> None:
    """A one-line warning on stderr, once per process."""
    if message not in _warned:
        _warned.add(message)
        sys.stderr.write(f"warning: {message}\n")


def _origin(dist) -> str:
    try:
        name = dist.metadata["Name"] or dist.name
    except Exception:  # a broken METADATA file: the distribution still has a folder name
        name = getattr(dist, "name", None) or "unknown distribution"
    return f"{name} {dist.version}"


def plugin_entry_points(group: str) -> list[tuple[str, str, str]]:
    """The entry points of `group` of every installed distribution, as (name, value,
    origin), read once per process (all groups at once) and deduplicated (a distribution
    seen twice on sys.path counts once)."""
    global _entry_points
    if _entry_points is None:
        found: dict[str, list[tuple[str, str, str]]] = {}
        for dist in _distributions():
            try:
                eps = [ep for ep in dist.entry_points if ep.group.startswith("nasctl.")]
            except Exception:  # an unreadable entry_points.txt of some other package
                continue
            for ep in eps:
                item = (ep.name, ep.value, _origin(dist))
                if item not in found.setdefault(ep.group, []):
                    found[ep.group].append(item)
        _entry_points = found
    return list(_entry_points.get(group, []))


def _distributions():
    """The installed distributions, or none where a quick look at sys.path finds no
    metadata naming a `nasctl.` entry-point group (importlib.metadata alone takes longer
    to import than `nasctl predict` takes to price a model)."""
    import os

    for folder in sys.path:
        try:
            items = list(os.scandir(folder or "."))
        except NotADirectoryError:  # a zip file on sys.path: let importlib.metadata look inside
            break
        except OSError:
            continue
        for item in items:
            if item.name.endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(item.path, "entry_points.txt"), encoding="utf-8", errors="replace") as f:
                        if "[nasctl." in f.read():
                            break
                except OSError:
                    continue
        else:
            continue
        break
    else:
        return []
    from importlib.metadata import distributions

    return distributions()


def reset_plugins() -> None:
    """Forget the entry points read so far: the next use of each registry reads them again
    (for tests, and for a process that installed a plugin after starting)."""
    global _entry_points
    _entry_points = None
    _warned.clear()
    for registry in list(_registries):
        registry._forget_plugins()


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    path: str    # "module:attribute"
    origin: str  # "built-in", or "DISTRIBUTION VERSION" for a plugin's entry


class Registry:
    def __init__(self, what: str, group: str | None = None):
        self.what = what  # e.g. "strategy", used in error messages
        self.group = group  # the entry-point group plugins register in, e.g. "nasctl.strategies"
        self._entries: dict[str, RegistryEntry] = {}
        self._builtin: set[str] = set()
        self._discovered = group is None
        self._failed: dict[str, str] = {}  # plugin entries that did not load: name -> error
        _registries.add(self)

    def register(self, name: str, path: str, origin: str = BUILT_IN) -> None:
        if name in self._entries:
            raise ValueError(f"{self.what} '{name}' is already registered ({self._entries[name].path})")
        self._entries[name] = RegistryEntry(name, path, origin)
        if origin == BUILT_IN:
            self._builtin.add(name)

    def _forget_plugins(self) -> None:
        self._entries = {n: e for n, e in self._entries.items() if n in self._builtin}
        self._failed.clear()
        self._discovered = self.group is None

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for name, value, origin in plugin_entry_points(self.group):
            module, sep, attr = value.partition(":")
            if name in self._entries:
                held = self._entries[name]
                if held.origin == origin and held.path == value:
                    continue
                owner = "the built-in one" if held.origin == BUILT_IN else f"the one of {held.origin}"
                warn(f"plugin {origin}: {self.what} '{name}' ({self.group}) is refused: its name is taken "
                     f"by {owner}, which is used")
            elif not module or not sep or not attr:
                warn(f"plugin {origin}: {self.what} '{name}' ({self.group}) is refused: its entry point "
                     f"'{value}' is not of the form module:attribute")
            else:
                self._entries[name] = RegistryEntry(name, value, origin)

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries)

    def entries(self) -> list[RegistryEntry]:
        """Every entry, by name, with its origin."""
        self._discover()
        return [self._entries[n] for n in sorted(self._entries)]

    def __contains__(self, name: str) -> bool:
        self._discover()
        return name in self._entries

    def get(self, name: str) -> Any:
        self._discover()
        try:
            entry = self._entries[name]
        except KeyError:
            raise UsageError(f"unknown {self.what} '{name}'; allowed: {', '.join(self.names())}") from None
        if entry.origin == BUILT_IN:
            module, _, attr = entry.path.partition(":")
            return getattr(importlib.import_module(module), attr)
        if name not in self._failed:
            try:
                return self._load(entry)
            except Exception as e:  # whatever a plugin's import raises, the user gets one line
                lines = str(e).strip().splitlines()
                self._failed[name] = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
        raise UsageError(f"{self.what} '{name}' of plugin {entry.origin} cannot be loaded ({entry.path}): "
                         f"{self._failed[name]}")

    @staticmethod
    def _load(entry: RegistryEntry) -> Any:
        module, _, attr = entry.path.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise AttributeError(f"module '{module}' has no attribute '{attr}'") from None
        return obj

    def check_plugins(self) -> dict[str, str]:
        """Load every plugin entry; warn (one line each, on stderr) of those that fail, and
        return them as name -> error."""
        for entry in self.entries():
            if entry.origin == BUILT_IN:
                continue
            try:
                self.get(entry.name)
            except UsageError as e:
                warn(str(e))
        return dict(self._failed)
