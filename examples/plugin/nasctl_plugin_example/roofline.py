"""`kind: mcu-roofline` - a microcontroller priced by a roofline per layer.

A layer takes the longer of its compute time (multiply-accumulates at the core's rate for
its bit width; other ops at `vector_ops_per_cycle` elements a cycle) and its memory time
(weights, inputs and outputs at `memory_gb_s`), plus `per_layer_us` of call overhead.
Energy: `pj_per_mac` per MAC at the width, `pj_per_byte` per byte moved, and `static_mw`
for the whole of the latency.  A width missing from `macs_per_cycle` is not priced.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nasctl.hardware.base import CostModel, LayerCost
from nasctl.hardware.layers import MAC_OPS, LayerSpec


class McuRooflineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    description: str = ""
    clock_mhz: float = Field(gt=0)
    macs_per_cycle: dict[int, float] = Field(min_length=1)   # bit width -> MACs per cycle
    vector_ops_per_cycle: float = Field(default=1.0, gt=0)
    memory_gb_s: float = Field(gt=0)
    per_layer_us: float = Field(default=0.0, ge=0)
    pj_per_mac: dict[int, float] = Field(min_length=1)
    pj_per_byte: float = Field(ge=0)
    static_mw: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _same_widths(self):
        if set(self.macs_per_cycle) != set(self.pj_per_mac):
            raise ValueError("macs_per_cycle and pj_per_mac must name the same bit widths")
        if min(self.macs_per_cycle.values()) <= 0:
            raise ValueError("macs_per_cycle: every rate must be positive")
        return self


class McuRoofline(CostModel):
    def __init__(self, spec: McuRooflineSpec):
        self.spec = spec
        self.name = spec.name

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> McuRoofline:
        return cls(McuRooflineSpec.model_validate(data))

    def describe(self) -> dict:
        return self.spec.model_dump()

    def _layer_cost(self, layer: LayerSpec) -> LayerCost | None:
        s = self.spec
        bits = max(layer.w_bits, layer.a_bits) if layer.op in MAC_OPS else layer.a_bits
        if bits not in s.macs_per_cycle:
            return None
        hz = s.clock_mhz * 1e6
        if layer.op in MAC_OPS:
            compute_s = layer.macs / (hz * s.macs_per_cycle[bits])
        else:
            compute_s = layer.out_elems / (hz * s.vector_ops_per_cycle)
        moved = layer.weight_bytes + layer.in_bytes + layer.out_bytes
        latency_s = max(compute_s, moved / (s.memory_gb_s * 1e9)) + s.per_layer_us * 1e-6
        energy_pj = layer.macs * s.pj_per_mac[bits] + moved * s.pj_per_byte + s.static_mw * 1e9 * latency_s
        return LayerCost(latency_s * 1e3, energy_pj * 1e-9, "roofline")
