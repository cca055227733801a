"""Loading YAML specs with errors that name the file and the key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


def read_text(path: Path) -> str:
    """A user's text file (spec, config, table) as UTF-8 (a byte-order mark is skipped); a
    file that cannot be read or is not UTF-8 is a one-line ConfigError naming it."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                          "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None


def unique_columns(where, header) -> None:
    """A CSV header naming a column twice is refused (csv keeps the last, pandas renames the
    second to 'NAME.1': either way a column is silently lost)."""
    twice = sorted({c for c in header if list(header).count(c) > 1})
    if twice:
        raise ConfigError(f"{where}: the column '{twice[0]}' appears twice in the header; give each column once")


class _DuplicateKey(Exception):
    pass


class _UniqueKeys(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml where present
    """A safe loader that refuses a mapping naming a key twice (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            try:
                key = self.construct_object(key_node, deep=True)
                hash(key)
            except (TypeError, yaml.YAMLError):
                continue  # an unhashable key: the constructor says what is wrong with it
            if key in seen:
                raise _DuplicateKey(f"line {key_node.start_mark.line + 1}: key '{key}' is given twice (line "
                                    f"{seen[key]} too); give each key once")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeys)
    except _DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}:{where} is not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return data


def problem(first: dict) -> str:
    """What one pydantic error says, without pydantic's prefix for a validator's own message."""
    return "unknown key" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")


def _union_tag(part) -> bool:
    """A step of a pydantic error path naming which type of a union was tried ('int',
    'list[int]', a model class such as 'MacArray'), not a key of the file (keys are lower case)."""
    return isinstance(part, str) and (part in ("int", "float", "str", "bool") or "[" in part or part[:1].isupper())


def _branch(loc) -> bool:
    return any(_union_tag(p) for p in loc)


def _key(loc) -> tuple:
    """The key of the file an error path is about (up to the first union step)."""
    tags = [i for i, p in enumerate(loc) if _union_tag(p)]
    return tuple(loc[:tags[0]] if tags else loc)


def validation_message(err: Exception) -> str:
    """The first problem of a pydantic ValidationError as 'key.path: message'."""
    errors = err.errors()  # type: ignore[attr-defined]
    # A value of a key taking one value or a list (`depth: 2` or `depth: [1, 2]`) fails both
    # ways: the error deepest in the value says most (`depth.1`: the list's second item).
    first = max(errors, key=lambda e: len(e["loc"])) if all(_branch(e["loc"]) for e in errors) else errors[0]
    loc = ".".join(str(p) for p in first["loc"] if not _union_tag(p))
    msg = problem(first)
    given = first.get("input")
    if first["type"] != "extra_forbidden" and isinstance(given, (bool, int, float, str)) and len(str(given)) < 40:
        msg += f" (got {given!r})"
    more = len({_key(e["loc"]) for e in errors}) - 1  # the keys at fault
    # a check of several keys at once has no single path: its message names the keys
    return (f"{loc}: {msg}" if loc else msg) + (f" (and {more} more)" if more else "")


def build(path: Path, registry, what: str):
    """Read the spec at `path` and build it with the class its `kind:` names in `registry`."""
    from pydantic import ValidationError

    data = read_yaml(path)
    kind = data.get("kind")
    if kind is None:
        raise ConfigError(f"{path}: kind: missing; allowed: {', '.join(registry.names())}")
    if not isinstance(kind, str) or kind not in registry:
        raise ConfigError(f"{path}: kind: {kind!r} is not a {what} kind; allowed: {', '.join(registry.names())}")
    data.setdefault("name", path.parent.name if path.name == "spec.yaml" else path.stem)
    cls = registry.get(kind)
    try:
        # kinds whose spec names files beside it (a LUT device's table) read them from its folder
        return cls.from_spec_file(data, path) if hasattr(cls, "from_spec_file") else cls.from_dict(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {validation_message(e)}") from None
