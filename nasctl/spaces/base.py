"""The search-space contract."""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from ..hardware.layers import LayerSpec

Arch = Mapping[str, Any]


def machine_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the system does not say:
    the bound a space's largest candidate is checked against (`SearchSpace.check_fits`)."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


@dataclass(frozen=True)
class Variable:
    """One knob of a space: a finite, ordered list of choices."""

    name: str
    choices: tuple

    def index(self, value) -> int:
        try:
            return self.choices.index(value)
        except ValueError:
            allowed = ", ".join(map(str, self.choices))
            raise UsageError(f"architecture knob '{self.name}' = {value!r} is not one of: {allowed}") from None


class SearchSpace(ABC):
    name: str
    description: str = ""

    @abstractmethod
    def variables(self) -> Sequence[Variable]: ...

    @abstractmethod
    def to_layers(self, arch: Arch, input_shape: tuple[int, int, int], classes: int) -> list[LayerSpec]:
        """The compute layers of `arch` for inputs of shape (C, H, W)."""

    @abstractmethod
    def build(self, arch: Arch, input_shape: tuple[int, int, int], classes: int):
        """A torch module with one output per exit (final classifier last)."""

    def default_input(self) -> tuple[tuple[int, int, int], int]:
        """Input shape (C, H, W) and class count when no dataset gives them (table-scored searches)."""
        raise UsageError(f"space '{self.name}' takes its input shape from a dataset; "
                         "score it with --accuracy proxy")

    def check_fits(self, input_shape: tuple[int, int, int], classes: int, batch_size: int) -> None:
        """Refuse (a one-line ConfigError) a space whose largest candidate could not be
        trained on this machine at this input and batch size; spaces of fixed, small
        networks need not override it."""

    def exit_names(self) -> list[str]:
        """Names of every exit the space can have, final classifier last (trials.csv columns)."""
        return ["final"]

    def active_exits(self, arch: Arch) -> list[str]:
        """Names of the exits `arch` has, final classifier last."""
        return ["final"]

    def path_costs(self, device, archs: Sequence[Arch], input_shape: tuple[int, int, int],
                   classes: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Latency and energy of reaching each exit of `exit_names()` for a batch of
        architectures: arrays of shape (len(archs), len(exit_names())), NaN where an
        architecture lacks that exit; energy is None on latency-only devices.  Spaces
        may override this with a vectorised version that gives the same numbers."""
        names = self.exit_names()
        lat = np.full((len(archs), len(names)), np.nan)
        en = np.full_like(lat, np.nan) if device.models_energy else None
        for i, arch in enumerate(archs):
            report = device.estimate(self.to_layers(arch, input_shape, classes))
            cols = [names.index(e) for e in self.active_exits(arch)]
            path_lat, path_en = report.exit_path_costs()
            lat[i, cols] = path_lat
            if en is not None:
                en[i, cols] = path_en
        return lat, en

    # -- generic operations over the variables -------------------------------------
    def validate(self, arch: Arch) -> dict:
        names = [v.name for v in self.variables()]
        unknown = sorted(set(arch) - set(names))
        if unknown:
            raise UsageError(f"architecture has unknown knob(s) {', '.join(unknown)} for space "
                             f"'{self.name}'; its knobs are: {', '.join(names)}")
        missing = [n for n in names if n not in arch]
        if missing:
            raise UsageError(f"architecture lacks knob(s) {', '.join(missing)} of space '{self.name}'")
        out = {}
        for v in self.variables():
            v.index(arch[v.name])
            out[v.name] = arch[v.name]
        return out

    def idle_knobs(self, arch: Arch) -> list[str]:
        """The knobs whose value has no effect on `arch`'s network (e.g. the width of an
        exit that is off): none unless a space says so."""
        return []

    def canonical(self, arch: Arch) -> dict:
        """`arch` with each of its idle knobs at that knob's first choice: architectures with
        the same canonical form build the same network (the same layers, and the same
        weights from the same seed), so they train, measure and price alike."""
        arch = self.validate(arch)
        return {**arch, **{k: next(v.choices[0] for v in self.variables() if v.name == k)
                           for k in self.idle_knobs(arch)}}

    def parse_arch(self, text: str) -> dict:
        """An architecture from its text form: JSON knob values, as in trials.csv's `arch` column."""
        try:
            arch = json.loads(text)
        except ValueError:
            arch = None
        if not isinstance(arch, dict):
            raise UsageError(f"architecture '{text}' is not a JSON object of knob values of space '{self.name}'")
        return self.validate(arch)

    def sample(self, rng: np.random.Generator) -> dict:
        return {v.name: v.choices[int(rng.integers(len(v.choices)))] for v in self.variables()}

    def mutate(self, arch: Arch, rng: np.random.Generator, rate: float | None = None) -> dict:
        """Resample each knob with probability `rate` (default 1/n); at least one changes."""
        variables = [v for v in self.variables() if len(v.choices) > 1]
        rate = 1.0 / max(len(variables), 1) if rate is None else rate
        out = dict(arch)
        changed = False
        for v in variables:
            if rng.random() < rate:
                out[v.name] = _other_choice(v, arch[v.name], rng)
                changed = True
        if not changed and variables:
            v = variables[int(rng.integers(len(variables)))]
            out[v.name] = _other_choice(v, arch[v.name], rng)
        return out

    def to_indices(self, arch: Arch) -> np.ndarray:
        return np.array([v.index(arch[v.name]) for v in self.variables()], dtype=np.int64)

    def from_indices(self, idx: Sequence[int]) -> dict:
        return {v.name: v.choices[int(i)] for v, i in zip(self.variables(), idx)}

    def encode(self, arch: Arch, kind: str = "ordinal") -> np.ndarray:
        """Features for predictors: 'ordinal' (each knob's index scaled to [0, 1]) or 'onehot'."""
        idx = self.to_indices(arch)
        sizes = [len(v.choices) for v in self.variables()]
        if kind == "ordinal":
            return np.array([i / (n - 1) if n > 1 else 0.0 for i, n in zip(idx, sizes)])
        if kind == "onehot":
            return np.concatenate([np.eye(n)[i] for i, n in zip(idx, sizes)])
        raise UsageError(f"unknown encoding '{kind}'; allowed: ordinal, onehot")

    def size(self) -> int:
        return int(np.prod([len(v.choices) for v in self.variables()], dtype=object))

    def describe(self) -> dict:
        return {"name": self.name, "description": self.description,
                "size": self.size(),
                "knobs": {v.name: list(v.choices) for v in self.variables()}}


def _other_choice(v: Variable, current, rng: np.random.Generator):
    others = [c for c in v.choices if c != current]
    return others[int(rng.integers(len(others)))]


def arch_key(arch: Arch) -> str:
    """Canonical JSON of an architecture: a stable key and the `arch` column of trials.csv."""
    return json.dumps(dict(arch), separators=(",", ":"))


def space_fingerprint(space: SearchSpace) -> str:
    """Hash of a space's knobs and their choices: a predictor only fits the space it learnt."""
    knobs = {v.name: [str(c) for c in v.choices] for v in space.variables()}
    return hashlib.sha256(json.dumps(knobs, sort_keys=True).encode()).hexdigest()[:16]
