"""Where named data (search spaces, devices, predictors) and run folders live.

Names resolve in this order: the workspace given by `--workspace` or
`NASCTL_WORKSPACE`, the current project (the nearest folder upwards holding a
`pyproject.toml` with a `[tool.nasctl]` table), the copies packaged with nasctl, then
those of installed plugins: an entry point of group `nasctl.data` names a package whose
folder holds data folders (`search_spaces/`, `hardware/`, ...); its entries' origin is
the plugin's distribution and version.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import UsageError

DATA_FOLDERS = ("search_spaces", "hardware", "predictors", "presets")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # what the user names: a folder, and NAME in kind:NAME
_PACKAGE = Path(__file__).resolve().parent
_explicit: Path | None = None


def set_workspace(path: Path | None) -> None:
    """Called by the CLI for `--workspace`; None falls back to NASCTL_WORKSPACE."""
    global _explicit
    _explicit = path


def explicit() -> Path | None:
    """The workspace `--workspace` set in this process (None: not set; NASCTL_WORKSPACE and
    the current folder are inherited by child processes anyway)."""
    return _explicit


@dataclass(frozen=True)
class Root:
    origin: str  # "workspace", "project", "packaged", or a plugin's "DISTRIBUTION VERSION"
    path: Path


def _is_project(folder: Path) -> bool:
    pyproject = folder / "pyproject.toml"
    return pyproject.is_file() and "[tool.nasctl]" in pyproject.read_text(encoding="utf-8", errors="replace")


def _packaged_root() -> Path:
    data = _PACKAGE / "_data"  # a wheel carries the data folders here
    return data if data.is_dir() else _PACKAGE.parent  # a source checkout holds them at its root


def roots() -> list[Root]:
    out: list[Root] = []
    explicit = _explicit or (Path(os.environ["NASCTL_WORKSPACE"]) if os.environ.get("NASCTL_WORKSPACE") else None)
    if explicit is not None:
        if not explicit.is_dir():
            raise UsageError(f"workspace '{explicit}' is not a folder")
        out.append(Root("workspace", explicit.resolve()))
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if _is_project(folder):
            out.append(Root("project", folder))
            break
    out.append(Root("packaged", _packaged_root()))
    out += _plugin_roots()
    seen: set[Path] = set()
    unique = []
    for r in out:
        if r.path not in seen:
            seen.add(r.path)
            unique.append(r)
    return unique


def _plugin_roots() -> list[Root]:
    """The data folders of installed plugins (entry points of group `nasctl.data`, each
    naming a package); found without importing the package where it is a top-level one."""
    import importlib.util

    from .registry import plugin_entry_points, warn

    found = []
    for name, value, origin in plugin_entry_points("nasctl.data"):
        try:
            spec = importlib.util.find_spec(value)
            folders = list(spec.submodule_search_locations or []) if spec is not None else []
        except Exception as e:  # a dotted name imports its parents, whatever they raise
            warn(f"plugin {origin}: data entry '{name}' (nasctl.data) names package '{value}', which "
                 f"cannot be found: {e}")
            continue
        if not folders:
            warn(f"plugin {origin}: data entry '{name}' (nasctl.data) names '{value}', which is not a package")
            continue
        found.append(Root(origin, Path(folders[0]).resolve()))
    return found


def runs_folder() -> Path:
    """`runs/` of the workspace or project; `./runs` when only packaged data is in use."""
    for r in roots():
        if r.origin in ("workspace", "project"):
            return r.path / "runs"
    return Path.cwd() / "runs"


@dataclass(frozen=True)
class Entry:
    name: str
    path: Path
    origin: str
    hides: tuple[str, ...] = ()  # origins of entries of the same name this one hides (later roots)


def entries(folder: str) -> list[Entry]:
    """Every named entry of a data folder, first root winning (the entry records the origins
    of those it hides); `NAME.yaml` or `NAME/spec.yaml`."""
    found: dict[str, Entry] = {}
    for r in roots():
        base = r.path / folder
        if not base.is_dir():
            continue
        for p in sorted(base.iterdir()):
            if p.name.startswith("."):  # a device being written (`fit.write_device`), or hidden
                continue
            if p.suffix in (".yaml", ".yml") and p.is_file():
                name, spec = p.stem, p
            elif p.is_dir() and (p / "spec.yaml").is_file():
                name, spec = p.name, p / "spec.yaml"
            else:
                continue
            first = found.get(name)
            found[name] = Entry(name, spec, r.origin) if first is None else \
                replace(first, hides=(*first.hides, r.origin))
    return sorted(found.values(), key=lambda e: e.name)


def card_folders(folder: str, card: str) -> list[Entry]:
    """Every FOLDER/NAME/ holding a file `card` (a saved predictor, a supernet), first root
    winning, by name."""
    found: dict[str, Entry] = {}
    for root in roots():
        base = root.path / folder
        if base.is_dir():
            for p in sorted(base.iterdir()):
                if (p / card).is_file():
                    found.setdefault(p.name, Entry(p.name, p, root.origin))
    return sorted(found.values(), key=lambda e: e.name)


def find_card_folder(folder: str, card: str, name: str, what: str, none: str = "none") -> Path:
    """The folder of `what` `name`: a workspace name (see `card_folders`) or a folder path
    holding `card`; a one-line UsageError listing the known ones (`none` where there are none)."""
    if (Path(name) / card).is_file():
        return Path(name)
    entries = card_folders(folder, card)
    for e in entries:
        if e.name == name:
            return e.path
    raise UsageError(f"unknown {what} '{name}'; known: {', '.join(e.name for e in entries) or none}")


def find(folder: str, name: str, what: str) -> Path:
    """Path of entry `name`; or `name` itself if it is a YAML file path, or its spec.yaml if
    it is the path (with a folder separator in it) of a folder holding one."""
    p = Path(name).expanduser()
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise UsageError(f"{what} file '{name}' does not exist")
        return p
    if any(sep in name for sep in ("/", os.sep)) or name in (".", ".."):
        if (p / "spec.yaml").is_file():
            return p / "spec.yaml"
        raise UsageError(f"{what} folder '{name}' holds no spec.yaml" if p.is_dir() else
                         f"{what} '{name}' is neither a name nor an existing YAML file or folder")
    for e in entries(folder):
        if e.name == name:
            return e.path
    known = ", ".join(e.name for e in entries(folder)) or "none"
    # cpu-local is the device `nasctl hw profile` measures by default; none is shipped
    hint = "; create it with `nasctl hw profile`" if (folder, name) == ("hardware", "cpu-local") else ""
    raise UsageError(f"unknown {what} '{name}'; known: {known}{hint}")


def new_entry(folder: str, name: str, what: str) -> Path:
    """FOLDER/NAME/ in the user's workspace or project, where a `what` the user makes (a
    fitted device, a trained predictor) is written; a one-line UsageError where there is no
    workspace or the name is not a plain name."""
    root = roots()[0]
    if root.origin not in ("workspace", "project"):
        raise UsageError(f"no workspace to save the {what} into: give --workspace DIR (or set NASCTL_WORKSPACE), "
                         "or run inside a project whose pyproject.toml has a [tool.nasctl] table")
    if not PLAIN_NAME.fullmatch(name):
        raise UsageError(f"{what} name '{name}' must be a plain name: letters, digits, '-', '_' and '.', starting "
                         "with a letter, digit or '_'")
    if name.endswith((".yaml", ".yml")):
        raise UsageError(f"{what} name '{name}' ends in {name[name.rindex('.'):]}: that reads as a file path; "
                         f"give the name alone ('{name[:name.rindex('.')]}')")
    path = root.path / folder / name
    for spec in (path.with_name(f"{name}.yaml"), path.with_name(f"{name}.yml")):
        if spec.is_file():  # `entries` finds NAME.yaml before NAME/: a new NAME/ would be hidden by it
            raise UsageError(f"cannot write the {what} '{name}': {spec} holds one of that name; remove it or "
                             "choose another name")
    if path.exists() and not path.is_dir():
        raise UsageError(f"cannot write the {what} '{name}': {path} is a file, not a folder; remove it or choose "
                         "another name")
    return path
