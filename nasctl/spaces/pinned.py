"""A search space with some of its knobs fixed: `pin: {knob: value}` in a search's settings.

The static baselines of an early-exit search are the same space with its exits pinned off
and its bit widths pinned (e.g. `exit_s1: 0, exit_s2: 0, backbone_bits: 8`): every other
knob is searched as before, and architectures, layers, networks and costs are the
underlying space's own.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import UsageError
from .base import Arch, SearchSpace, Variable


def pin_knobs(space: SearchSpace, pins: Mapping[str, object]) -> SearchSpace:
    """`space` with each knob of `pins` narrowed to its one value; `space` itself without pins."""
    return PinnedSpace(space, pins) if pins else space


class PinnedSpace(SearchSpace):
    def __init__(self, space: SearchSpace, pins: Mapping[str, object]):
        knobs = {v.name: v for v in space.variables()}
        for name, value in pins.items():
            if name not in knobs:
                raise UsageError(f"pin: '{name}' is not a knob of space '{space.name}'; its knobs are: "
                                 f"{', '.join(knobs)}")
        # the knob's own choice (a value the knob does not offer is a one-line error): 1.0
        # pins a depth of 1 as the int the network is built with
        pins = {name: knobs[name].choices[knobs[name].index(value)] for name, value in pins.items()}
        self.inner = space
        self.pins = dict(pins)
        self.name, self.description = space.name, space.description
        self._variables = tuple(Variable(v.name, (pins[v.name],)) if v.name in pins else v
                                for v in space.variables())

    def variables(self) -> tuple[Variable, ...]:
        return self._variables

    def parse_arch(self, text: str) -> dict:
        return self.inner.parse_arch(text)  # the inner space's text forms (NB201's cell strings)

    def to_layers(self, arch: Arch, input_shape, classes):
        return self.inner.to_layers(arch, input_shape, classes)

    def build(self, arch: Arch, input_shape, classes):
        return self.inner.build(arch, input_shape, classes)

    def default_input(self):
        return self.inner.default_input()

    def exit_names(self) -> list[str]:
        return self.inner.exit_names()

    def active_exits(self, arch: Arch) -> list[str]:
        return self.inner.active_exits(arch)

    def idle_knobs(self, arch: Arch) -> list[str]:
        return self.inner.idle_knobs(arch)  # set to this space's first choice: a pinned knob's pin

    def path_costs(self, device, archs, input_shape, classes):
        if isinstance(archs, np.ndarray):  # knob indices of this space, not of the inner one
            archs = [self.from_indices(row) for row in archs]
        return self.inner.path_costs(device, archs, input_shape, classes)

    def describe(self) -> dict:
        return {**super().describe(), "pinned": dict(self.pins)}
