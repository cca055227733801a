"""A search space with the device's own knobs added: `--co-search` (`co_search: true`).

Each knob of the device's `co_search` section (cores, MAC array, SRAM sizes) becomes a
knob `hw_<name>` of the space, so a candidate is a network and an accelerator together.
Layers, networks and exits are the underlying space's, of the network knobs alone; costs
are priced on the accelerator the `hw_` knobs describe (`device.derive`).
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .base import Arch, SearchSpace, Variable

HW_PREFIX = "hw_"


def co_search(space: SearchSpace, device, device_name: str) -> SearchSpace:
    """`space` with the knobs of `device`'s co_search section added as `hw_<name>`."""
    knobs = getattr(device, "co_search_knobs", None)
    if knobs is None:
        raise UsageError(f"device '{device_name}' is not an analytical accelerator; --co-search needs one "
                         "whose spec has co_search and area sections (see edge-quad)")
    return CoSearchSpace(space, knobs())


class CoSearchSpace(SearchSpace):
    def __init__(self, space: SearchSpace, knobs: dict[str, tuple]):
        clash = [v.name for v in space.variables() if v.name.startswith(HW_PREFIX)]
        if clash:
            raise UsageError(f"space '{space.name}' has knob(s) {', '.join(clash)}; --co-search names the "
                             f"device's knobs {HW_PREFIX}<name>")
        self.inner = space
        self.name, self.description = space.name, space.description
        self._variables = (*space.variables(), *(Variable(HW_PREFIX + n, c) for n, c in knobs.items()))

    def variables(self) -> tuple[Variable, ...]:
        return self._variables

    @staticmethod
    def split(arch: Arch) -> tuple[dict, dict]:
        """(the network's knobs, the device's knobs without their prefix)."""
        net = {k: v for k, v in arch.items() if not k.startswith(HW_PREFIX)}
        return net, {k.removeprefix(HW_PREFIX): v for k, v in arch.items() if k.startswith(HW_PREFIX)}

    def to_layers(self, arch: Arch, input_shape, classes):
        return self.inner.to_layers(self.split(arch)[0], input_shape, classes)

    def build(self, arch: Arch, input_shape, classes):
        return self.inner.build(self.split(arch)[0], input_shape, classes)

    def default_input(self):
        return self.inner.default_input()

    def exit_names(self) -> list[str]:
        return self.inner.exit_names()

    def active_exits(self, arch: Arch) -> list[str]:
        return self.inner.active_exits(self.split(arch)[0])

    def idle_knobs(self, arch: Arch) -> list[str]:
        return self.inner.idle_knobs(self.split(arch)[0])

    def path_costs(self, device, archs, input_shape, classes):
        """Each architecture priced on the accelerator its `hw_` knobs derive from `device`."""
        if isinstance(archs, np.ndarray):
            archs = [self.from_indices(row) for row in archs]
        lat = np.full((len(archs), len(self.exit_names())), np.nan)
        en = np.full_like(lat, np.nan) if device.models_energy else None
        groups: dict[tuple, list[int]] = {}
        for i, arch in enumerate(archs):
            groups.setdefault(tuple(sorted(self.split(arch)[1].items())), []).append(i)
        for hw, rows in groups.items():
            nets = [self.split(archs[i])[0] for i in rows]
            g_lat, g_en = self.inner.path_costs(device.derive(dict(hw)), nets, input_shape, classes)
            lat[rows] = g_lat
            if en is not None:
                en[rows] = g_en
        return lat, en

    def describe(self) -> dict:
        return {**super().describe(), "co_search": [v.name for v in self._variables
                                                    if v.name.startswith(HW_PREFIX)]}
