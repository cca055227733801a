"""The cost-model contract and the early-exit cost arithmetic."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from .layers import LayerSpec


@dataclass(frozen=True, slots=True)
class LayerCost:
    latency_ms: float
    energy_mj: float | None  # None where the device models latency only
    mapping: str = ""        # how the layer was mapped, e.g. "4 cores, split K"


@dataclass
class CostReport:
    device: str
    layers: list[LayerSpec]
    costs: list[LayerCost]
    unsupported: Counter = field(default_factory=Counter)  # op kind -> count

    @property
    def latency_ms(self) -> float:
        return sum(c.latency_ms for c in self.costs)

    @property
    def energy_mj(self) -> float | None:
        if any(c.energy_mj is None for c in self.costs):
            return None
        return sum(c.energy_mj for c in self.costs)

    def exit_path_costs(self) -> tuple[list[float], list[float] | None]:
        """Latency and energy of reaching each exit (final classifier last).

        Reaching exit k costs every layer whose segment is <= k: the backbone up to
        the exit plus every exit head passed on the way, its own included.
        """
        n = 1 + max((layer.segment for layer in self.layers), default=0)
        lat = [0.0] * n
        en: list[float] | None = [0.0] * n
        for layer, cost in zip(self.layers, self.costs):
            for k in range(layer.segment, n):
                lat[k] += cost.latency_ms
                if en is not None:
                    if cost.energy_mj is None:
                        en = None
                    else:
                        en[k] += cost.energy_mj
        return lat, en


def expected_cost(path_costs: Sequence[float], exit_rates: Sequence[float]) -> float:
    """Σ_k p_k · cost of reaching exit k."""
    if len(path_costs) != len(exit_rates):
        raise ValueError(f"{len(path_costs)} exit costs but {len(exit_rates)} exit rates")
    return float(sum(c * p for c, p in zip(path_costs, exit_rates)))


class CostModel(ABC):
    """A device: prices lists of layers."""

    name: str
    models_energy: bool = True  # False for devices that model latency only

    def estimate(self, layers: Sequence[LayerSpec]) -> CostReport:
        costs: list[LayerCost] = []
        unsupported: Counter = Counter()
        for layer in layers:
            cost = self._layer_cost(layer)
            if cost is None:
                unsupported[layer.op] += 1
                cost = LayerCost(0.0, 0.0, "unsupported")
            costs.append(cost)
        return CostReport(self.name, list(layers), costs, unsupported)

    @abstractmethod
    def _layer_cost(self, layer: LayerSpec) -> LayerCost | None:
        """Cost of one layer, or None if this device cannot price its op."""

    def describe(self) -> dict:
        """A summary for `nasctl hw show`."""
        return {"name": self.name}
