"""Saved predictors: where they live, loading them back, checking what they fit.

A predictor NAME lives in `predictors/NAME/` of the first workspace root that has it
(see `nasctl.workspace`); a folder path holding a card.yaml also names one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import workspace
from ..errors import ConfigError, UsageError
from ..specs import read_yaml
from .base import CARD, FORMAT, STATE, Predictor, file_hash, space_fingerprint

FOLDER = "predictors"


@dataclass(frozen=True)
class Saved:
    name: str
    path: Path     # the predictor's folder
    origin: str    # workspace root kind: workspace, project or packaged


def saved() -> list[Saved]:
    """Every saved predictor, first root winning."""
    return [Saved(e.name, e.path, e.origin) for e in workspace.card_folders(FOLDER, CARD)]


def find(name: str) -> Path:
    """The folder of predictor `name` (a workspace name, or a folder holding a card.yaml)."""
    return workspace.find_card_folder(FOLDER, CARD, name, "predictor")


def read_card(folder: Path) -> dict:
    card = read_yaml(folder / CARD)
    fmt = card.get("format")
    if not isinstance(fmt, int):
        raise ConfigError(f"{folder / CARD}: format: missing or not a whole number")
    if fmt > FORMAT:
        raise ConfigError(f"{folder / CARD}: format {fmt} was written by a newer nasctl; this one reads "
                          f"format {FORMAT} and older (upgrade nasctl)")
    return card


def load(name: str, space=None) -> Predictor:
    import json

    from ..spaces.loader import load_space
    from .kinds import PREDICTORS

    folder = find(name)
    card = read_card(folder)
    for key in ("model", "space", "space_fingerprint", "files"):
        if key not in card:
            raise ConfigError(f"{folder / CARD}: {key}: missing")
    if space is None:
        space = load_space(card["space"])
    if card["space"] != space.name:
        raise UsageError(f"predictor '{name}' was trained for space '{card['space']}', not '{space.name}'")
    if card["space_fingerprint"] != space_fingerprint(space):
        raise UsageError(f"predictor '{name}' was trained for another version of space '{space.name}' "
                         "(its knobs or choices differ); train it again")
    for file, digest in card["files"].items():
        if not (folder / file).is_file() or file_hash(folder / file) != digest:
            raise ConfigError(f"{folder / file}: missing or changed since the predictor was saved")
    predictor = PREDICTORS.get(card["model"])(
        space, seed=card.get("seed", 0), encoding=card.get("encoding"), zero_cost=card.get("zero_cost") or (),
        input_shape=card.get("input_shape"), classes=card.get("classes"), **(card.get("params") or {}))
    predictor.restore(json.loads((folder / STATE).read_text(encoding="utf-8")), folder)
    return predictor
