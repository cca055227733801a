"""`kind: analytical` - an analytical model of a multi-core, bit-width-aware edge accelerator.

Each core has a weight-stationary MAC array unrolled over four loop dimensions, sized
`k x c x ox x oy` (output channels x input channels x output columns x output rows), a
vector unit for pooling and element-wise ops, a weight SRAM and an activation SRAM.  The
cores share one DRAM channel and exchange data over an on-chip network (NoC).

A layer is priced under every mapping onto the cores - on 1 core ("1"), or split over n
cores (n a divisor of the core count) along its output channels ("nxK": every core needs
the input of its groups, i.e. all of it for a dense conv) or its output rows ("nxOY":
every core needs all weights, plus halo input rows) - and the mapping with the least
energy-delay product wins.  For one mapping, with b the operand width (the larger of the
weight and activation bits; activation bits for pool and add), priced at the smallest
width the device supports that holds it:

  cycles   = unrolled tiles on the busiest core / macs_per_pe_cycle[b], where the tiles
             count ceil(dim / array size) for each unrolled dimension:
               dense or grouped conv, linear:  groups x ceil(K_g/k) x ceil(C_g/c)
                                               x ceil(OX/ox) x ceil(OY/oy) x kernel taps
               depthwise conv (C_g = 1):       ceil(K/k) x ceil(taps/c)
                                               x ceil(OX/ox) x ceil(OY/oy)
               (the input-channel rows cannot be filled, so they take the kernel taps)
               pool, add (vector unit):        ceil(input elements / vector_lanes)
  t_comp   = cycles / clock
  DRAM     = W + (I x passes + O, if a core's share of I + O exceeds its activation SRAM)
  t_dram   = DRAM / dram bandwidth
  NoC      = bytes replicated across cores: I x (max(n / groups, 1) - 1) for a K split
             (pool and add count each channel as a group); (n-1) x W + I x (n-1) x
             max(kh - stride, 0) / input rows (halo) for an OY split
  latency  = max(t_comp, t_dram) + NoC / noc bandwidth
  SRAM     = weights read (W + replicas) + inputs read ((I + replicas) x passes) + O written
  energy   = ops x e_op[b] + SRAM x e_sram + DRAM x e_dram + NoC x e_noc + P_static x latency

W, I and O are the layer's weight, input and output bytes (weights at w_bits, activations
at a_bits); passes = ceil(a core's weight share / its weight SRAM), the times the input is
streamed again when the weights do not fit at once.  ops x e_op is MACs x (mult + add
energy) for conv and linear, input elements x add energy for pool and add.  Costs are
cached per `LayerSpec.shape_key()`.
"""

from __future__ import annotations

from math import ceil
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationInfo,
                      field_validator)

from .base import CostModel, LayerCost
from .layers import MAC_OPS, LayerSpec

BitTable = dict[PositiveInt, PositiveFloat]
# The op kinds this model prices; others are reported as unsupported.
_PRICED = frozenset({"conv", "linear", "pool", "add"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MacArray(_Strict):
    """Spatial unrolling of one core's MAC array: PEs = k x c x ox x oy."""

    k: PositiveInt   # output channels (columns; inputs are broadcast along them)
    c: PositiveInt   # input channels, or kernel taps for depthwise convs (reduction rows)
    ox: PositiveInt  # output columns
    oy: PositiveInt  # output rows

    @property
    def pes(self) -> int:
        return self.k * self.c * self.ox * self.oy


class EnergySpec(_Strict):
    mult_pj: BitTable            # one multiply, by operand width
    add_pj: BitTable             # one add, by operand width
    sram_pj_per_byte: PositiveFloat
    dram_pj_per_byte: PositiveFloat
    noc_pj_per_byte: NonNegativeFloat
    static_mw: NonNegativeFloat = 0.0

    def mac_pj(self, bits: int) -> float:
        return self.mult_pj[bits] + self.add_pj[bits]


class AcceleratorSpec(_Strict):
    name: str
    kind: Literal["analytical"]
    description: str = ""
    cores: PositiveInt
    clock_mhz: PositiveFloat
    mac_array: MacArray                  # per core
    macs_per_pe_cycle: BitTable          # throughput of one PE by operand width
    vector_lanes: PositiveInt            # pool/add elements per cycle per core, x macs_per_pe_cycle
    weight_sram_kib: PositiveFloat       # per core
    act_sram_kib: PositiveFloat          # per core
    dram_gb_s: PositiveFloat
    noc_gb_s: PositiveFloat
    energy: EnergySpec
    sources: dict[str, str] = {}         # parameter path -> its public source or assumption

    @field_validator("energy")
    @classmethod
    def _same_widths(cls, v: EnergySpec, info: ValidationInfo) -> EnergySpec:
        rates = info.data.get("macs_per_pe_cycle")
        if rates is not None and not (set(rates) == set(v.mult_pj) == set(v.add_pj)):
            raise ValueError(f"macs_per_pe_cycle, energy.mult_pj and energy.add_pj must list the same "
                             f"bit widths; got {sorted(rates)}, {sorted(v.mult_pj)}, {sorted(v.add_pj)}")
        return v

    @field_validator("sources")
    @classmethod
    def _known_parameters(cls, v: dict[str, str]) -> dict[str, str]:
        known = set(cls.model_fields) - {"name", "kind", "description", "sources"}
        known |= {f"mac_array.{n}" for n in MacArray.model_fields}
        known |= {f"energy.{n}" for n in EnergySpec.model_fields}
        unknown = sorted(set(v) - known)
        if unknown:
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return v


class AnalyticalAccelerator(CostModel):
    """A multi-core accelerator priced by the equations in this module's docstring."""

    def __init__(self, spec: AcceleratorSpec):
        self.spec = spec
        self.name = spec.name
        self._cache: dict[tuple, LayerCost | None] = {}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnalyticalAccelerator:
        return cls(AcceleratorSpec.model_validate(data))

    @property
    def weight_capacity_bytes(self) -> int:
        """On-chip weight memory of all cores together."""
        return int(self.spec.cores * self.spec.weight_sram_kib * 1024)

    def describe(self) -> dict:
        s = self.spec
        params = s.model_dump(exclude={"name", "kind", "description", "sources"})
        peak = {b: round(2 * s.cores * s.mac_array.pes * r * s.clock_mhz * 1e6 / 1e12, 3)
                for b, r in sorted(s.macs_per_pe_cycle.items())}
        return {"name": s.name, "kind": s.kind, "description": s.description, **params,
                "peak_tops_by_bits": peak, "weight_capacity_bytes": self.weight_capacity_bytes,
                "sources": dict(s.sources)}

    def _layer_cost(self, layer: LayerSpec) -> LayerCost | None:
        key = layer.shape_key()
        if key not in self._cache:
            options = self.alternatives(layer)
            self._cache[key] = min(options, key=lambda c: c.latency_ms * c.energy_mj) if options else None
        return self._cache[key]

    def alternatives(self, layer: LayerSpec) -> list[LayerCost]:
        """The layer's cost under every mapping onto the cores; empty if it cannot be priced."""
        if layer.op not in _PRICED or self._width(layer) is None:
            return []
        options = [self._mapped(layer, 1, "")]
        for n in range(2, self.spec.cores + 1):
            if self.spec.cores % n == 0:
                if layer.out_ch >= n:
                    options.append(self._mapped(layer, n, "K"))
                if layer.out_hw[0] >= n:
                    options.append(self._mapped(layer, n, "OY"))
        return options

    def _width(self, layer: LayerSpec) -> int | None:
        """The smallest supported width holding the layer's operands, or None."""
        need = max(layer.w_bits, layer.a_bits) if layer.op in MAC_OPS else layer.a_bits
        return min((b for b in self.spec.macs_per_pe_cycle if b >= need), default=None)

    def _mapped(self, layer: LayerSpec, n: int, dim: str) -> LayerCost:
        s, a, e = self.spec, self.spec.mac_array, self.spec.energy
        bits = self._width(layer)
        vector = layer.op not in MAC_OPS
        K, (OY, OX), (kh, kw) = layer.out_ch, layer.out_hw, layer.kernel
        G = layer.in_ch if vector else layer.groups  # vector ops are channel-wise
        W, I, O = layer.weight_bytes, layer.in_bytes, layer.out_bytes

        # The busiest core's output channels, groups, output rows and share of the input
        # rows (vector ops); the bytes replicated across cores.
        k_c, g_c, oy_c, in_share = K, G, OY, 1.0
        in_repl = w_repl = 0.0
        if dim == "K":
            k_c, g_c, in_share = ceil(K / n), ceil(G / n), ceil(G / n) / G
            in_repl = I * (max(n / G, 1.0) - 1.0)
        elif dim == "OY":
            in_h = layer.in_hw[0]
            oy_c = ceil(OY / n)
            in_share = min(in_h, (oy_c - 1) * layer.stride + kh) / in_h
            in_repl = I * (n - 1) * min(max(kh - layer.stride, 0), in_h) / in_h  # halo rows
            w_repl = (n - 1) * W

        rate = s.macs_per_pe_cycle[bits]
        if vector:
            tiles = ceil(layer.in_elems * in_share / s.vector_lanes)
            ops_pj = layer.in_elems * e.add_pj[bits]
        else:
            spatial = ceil(OX / a.ox) * ceil(oy_c / a.oy)
            c_g = layer.in_ch // layer.groups
            if c_g == 1:
                tiles = ceil(k_c / a.k) * ceil(kh * kw / a.c) * spatial
            else:
                tiles = g_c * ceil(ceil(k_c / g_c) / a.k) * ceil(c_g / a.c) * kh * kw * spatial
            ops_pj = layer.macs * e.mac_pj(bits)
        t_comp = tiles / rate / (s.clock_mhz * 1e6)

        w_read, in_read = W + w_repl, I + in_repl
        passes = max(1, ceil(w_read / n / (s.weight_sram_kib * 1024)))
        spill = (in_read + O) / n > s.act_sram_kib * 1024
        dram = W + ((I * passes + O) if spill else 0.0)
        noc = in_repl + w_repl
        sram = w_read + in_read * passes + O

        latency_s = max(t_comp, dram / (s.dram_gb_s * 1e9)) + noc / (s.noc_gb_s * 1e9)
        energy_pj = (ops_pj + sram * e.sram_pj_per_byte + dram * e.dram_pj_per_byte
                     + noc * e.noc_pj_per_byte + e.static_mw * 1e-3 * latency_s * 1e12)
        return LayerCost(latency_s * 1e3, energy_pj * 1e-9, f"{n}x{dim}" if dim else "1")
