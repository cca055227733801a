"""The cost-model contract and the early-exit cost arithmetic."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

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

    def exit_path_costs(self, roles: Collection[str] | None = None) -> tuple[list[float], list[float] | None]:
        """Latency and energy of reaching each exit (final classifier last).

        Reaching exit k costs every layer whose segment is <= k: the backbone up to
        the exit plus every exit head passed on the way, its own included.  With
        `roles`, only the layers of those roles count (e.g. {"exit"}: the exit heads).
        """
        n = 1 + max((layer.segment for layer in self.layers), default=0)
        lat = [0.0] * n
        en: list[float] | None = [0.0] * n
        for layer, cost in zip(self.layers, self.costs):
            if roles is not None and layer.role not in roles:
                continue
            for k in range(layer.segment, n):
                lat[k] += cost.latency_ms
                if en is not None:
                    if cost.energy_mj is None:
                        en = None
                    else:
                        en[k] += cost.energy_mj
        return lat, en


    def static_costs(self) -> tuple[float, float | None]:
        """Latency and energy of the static network: the same layers without the exit heads."""
        lat, en = self.exit_path_costs(roles={"exit"})
        return self.latency_ms - lat[-1], None if en is None else self.energy_mj - en[-1]


def expected_cost(path_costs: Sequence[float], exit_rates: Sequence[float]) -> float:
    """Σ_k p_k · cost of reaching exit k."""
    if len(path_costs) != len(exit_rates):
        raise ValueError(f"{len(path_costs)} exit costs but {len(exit_rates)} exit rates")
    return float(sum(c * p for c, p in zip(path_costs, exit_rates)))


def exit_overhead(head_path_energy: Sequence[float], exit_rates: Sequence[float], static_energy: float) -> float:
    """Energy of the exit heads on the expected path over the static network's energy:
    Σ_k p_k · H_k / E_static, with H_k the energy of the exit heads passed on the way to
    exit k (its own included) and E_static that of the same network without exit heads."""
    return expected_cost(head_path_energy, exit_rates) / static_energy


def dynamic_efficiency(edp: float, static_edp: float) -> float:
    """1 - EDP / static EDP: the share of the static network's energy-delay product the
    early exits save (negative where the exit heads cost more than they save)."""
    return 1.0 - edp / static_edp


class CostModel(ABC):
    """A device: prices lists of layers."""

    name: str
    models_energy: bool = True  # False for devices that model latency only

    @property
    def additive(self) -> bool:
        """Whether a model's price is the sum of its layers' prices, each layer priced alone
        (so a list of layers may be priced in pieces and the pieces added): true of a
        device that keeps `CostModel.estimate`; one that overrides it is taken to price
        something of the model as a whole unless it says otherwise."""
        return type(self).estimate is CostModel.estimate

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

    def with_layout(self, report: CostReport, layouts: Mapping[int, Sequence]) -> CostReport:
        """`report` with the cost of the model's layout reorders (`ImportResult.layouts`: the
        `layout.Reorder`s the ONNX importer finds, per vector width) added to the layers they
        are charged to, for a device that prices them (a profiled CPU); as it is for others."""
        return report

    def stand_ins(self, layers: Sequence[LayerSpec]) -> Counter:
        """(the layer's kernel type, the kernel type it was priced as) -> count, for the
        layers of `layers` this device prices from the measurements of another kernel than
        theirs, having none of their own (a profiled device's table); none for a device
        that prices every layer by a model of its own kernel."""
        return Counter()

    @abstractmethod
    def _layer_cost(self, layer: LayerSpec) -> LayerCost | None:
        """Cost of one layer, or None if this device cannot price its op."""

    def describe(self) -> dict:
        """A summary for `nasctl hw show`."""
        return {"name": self.name}
