"""`kind: analytical` - an analytical model of a multi-core, bit-width-aware edge accelerator.

Each core has a MAC array for convolutions and matrix products, a vector unit for every
other op, a weight SRAM and an activation SRAM.  The cores share one DRAM channel and
exchange data over an on-chip network (NoC).

The MAC array unrolls up to six loop dimensions, `mac_array: {k, c, ox, oy, fx, fy}`
(output channels, input channels, output columns, output rows, kernel columns, kernel
rows; 1 where not named): an 8x8x4x4 Edge-TPU-like array is `{k: 8, c: 8, ox: 4, oy: 4}`.
A reconfigurable array lists several unrollings and each layer takes the one needing the
fewest cycles (Eyeriss's row-stationary dataflow stacks the kernel rows of one filter,
times as many channels or filters as fit, on its PE rows, and output rows on its columns).

A layer is priced under every mapping onto the cores - on 1 core ("1"), or split over n
cores (n a divisor of the core count) along its output channels ("nxK": every core needs
the input of its groups, i.e. all of it for a dense conv) or its output rows ("nxOY":
every core needs all weights, plus halo input rows) - and the mapping with the least
energy-delay product wins.  Softmax, norm and data ops mix channels and are split along
rows only.  For one mapping, with b the operand width (the larger of the weight and
activation bits for layers with weights; activation bits otherwise), priced at the
smallest width the device supports that holds it:

  cycles   = unrolled tiles on the busiest core / macs_per_pe_cycle[b]
    MAC array (conv, conv_transpose, linear, matmul), over positions PY x PX (the output,
    or the input for conv_transpose, which scatters each input over kh x kw outputs),
    counting ceil(dim / unrolled size) per dimension, taps = ceil(kh/fy) x ceil(kw/fx):
      dense or grouped:     groups x ceil(K_g/k) x ceil(C_g/c) x ceil(PX/ox) x ceil(PY/oy) x taps
      depthwise (C_g = 1):  ceil(K/k) x ceil(taps/c) x ceil(PX/ox) x ceil(PY/oy)
      (the input-channel rows cannot be filled, so they take the kernel taps)
    vector unit (pool, add, mul, act, softmax, norm, resize, concat, split, data):
      ceil(E x max(ops, 1) / vector_lanes), E = max(input, output elements) and ops the
      adds + multiplies per element (`vector_work`); ops = 0 is pure data movement
      (concat, split, transpose, slice, ...), one pass of the lanes.
  t_comp   = cycles / clock
  DRAM     = W + (I x passes + O + B, if a core's share of I + O + B exceeds its activation SRAM)
  t_mem    = DRAM / dram bandwidth (with a weight memory: W leaves DRAM and streams from
             it in parallel, t_mem = max(DRAM / dram bandwidth, W / weight bandwidth))
  NoC      = bytes replicated across cores: I x (max(n / groups, 1) - 1) for a K split
             (vector ops count each channel as a group); (n-1) x S + I x (n-1) x
             max(kh - stride, 0) / input rows (halo) for an OY split (conv_transpose
             exchanges the overlapping output rows instead of input rows)
  latency  = max(t_comp, t_mem) + NoC / noc bandwidth
  SRAM     = stationary operand read (S + replicas) + inputs read ((I + replicas) x passes)
             + O (+ exchanged output rows) written
  energy   = ops x e_op + SRAM x e_sram + DRAM x e_dram + NoC x e_noc + P_static x latency
             [+ MAC array: 4 x MACs x b/8 x e_rf + SRAM x e_array]  [+ W x e_weight]

W, I and O are the layer's weight, input and output bytes (weights at w_bits, activations
at a_bits); B is matmul's second operand (in_ch x out_ch activations, no weights); S = W
+ B is the stationary operand; passes = ceil(a core's share of S / its weight SRAM), the
times the input is streamed again when S does not fit at once.  ops x e_op is MACs x
(mult + add energy) on the MAC array, E x (adds x add energy + multiplies x mult energy)
on the vector unit.  The optional per-level energies price a spatial array's inner
levels: every MAC reads a weight, an input and a partial sum from its PE's register file
and writes the partial sum back (4 accesses, e_rf per byte), and every SRAM byte of a
MAC-array layer crosses the array's network to the PEs (e_array per byte).  Costs are
cached per `LayerSpec.shape_key()`.

Chip area, for specs with an `area:` section (per-unit figures, each with its source):

  area_mm2 = cores x (PEs x pe_mm2 + vector_lanes x vector_lane_mm2
                      + (weight_sram_kib + act_sram_kib) x sram_mm2_per_kib
                      + router_mm2, on chips of two or more cores)

PEs is the largest unrolling's.  A `co_search:` section lists choices for the cores, the
MAC array and the SRAM sizes; `derive` gives the accelerator with one choice of each, its
static power scaled with its area (leakage and clocking grow with the silicon) and its
SRAM energy per byte with its SRAM per core: x (new / old KiB) ^ sram_energy_exponent.
"""

from __future__ import annotations

from math import ceil
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationInfo,
                      field_validator, model_validator)

from ..errors import UsageError
from .base import CostModel, LayerCost
from .layers import MAC_OPS, OPS, LayerSpec

BitTable = dict[PositiveInt, PositiveFloat]
# Layers whose stationary operand is weights (matmul multiplies two activations).
WEIGHTED_OPS = frozenset({"conv", "conv_transpose", "linear"})
# Ops that mix channels: an output-channel split would need a cross-core reduction.
_MIXES_CHANNELS = frozenset({"softmax", "norm", "data"})
# Vector-unit work per element: (adds, multiplies).  Max, compare and subtract count as adds.
_VECTOR_OPS = {
    "pool": (1, 0), "add": (1, 0), "mul": (0, 1),
    "softmax": (5, 3),  # max, subtract, exp (as a smooth activation), sum, scale by 1/sum
    "norm": (4, 3),     # mean, subtract, square, sum, scale by 1/sqrt(var), affine mul + add
                        # (a stand-alone batch norm, fn "batch", is only the affine: 1, 1)
    "concat": (0, 0), "split": (0, 0), "data": (0, 0),
}
# Piecewise-linear activations are one compare or select an element; smooth ones (sigmoid,
# tanh, gelu, silu, exp, ...) a low-order polynomial or table interpolation, two
# multiply-adds.  Resize: nearest copies, linear blends 2x2 inputs, cubic 4x4.
_PIECEWISE_LINEAR = frozenset({"relu", "relu6", "clip", "leakyrelu", "prelu", "hardtanh", "abs", "neg",
                               "max", "min", "sign"})
_SMOOTH = (2, 2)
_RESIZE = {"nearest": (0, 0), "linear": (3, 4), "cubic": (15, 16)}


def vector_work(layer: LayerSpec) -> tuple[int, int, int]:
    """(elements, adds per element, multiplies per element) of a vector-unit op."""
    fn = layer.fn.lower()
    if layer.op == "act":
        adds, mults = (1, 0) if fn in _PIECEWISE_LINEAR else _SMOOTH
    elif layer.op == "resize":
        adds, mults = next((v for k, v in _RESIZE.items() if k in fn), _RESIZE["linear"])
    elif layer.op == "norm" and fn == "batch":
        adds, mults = 1, 1
    else:
        adds, mults = _VECTOR_OPS[layer.op]
    return max(layer.in_elems, layer.out_elems), adds, mults


def positions(layer: LayerSpec) -> tuple[int, int]:
    """The (rows, columns) a MAC-array layer iterates over: its input for conv_transpose
    (each input position scatters into kh x kw outputs), its output otherwise."""
    return layer.in_hw if layer.op == "conv_transpose" else layer.out_hw


def second_operand_bytes(layer: LayerSpec) -> float:
    """Matmul's second activation operand (in_ch x out_ch per product, out_hw[1] products,
    e.g. attention heads); 0 for other ops."""
    return layer.in_ch * layer.out_ch * layer.out_hw[1] * layer.a_bits / 8 if layer.op == "matmul" else 0.0


class Strict(BaseModel):
    """Spec models: unknown keys refused, and every number finite (no .inf or .nan)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def check_sources(spec_cls: type[BaseModel], sources: dict[str, str],
                  nested: dict[str, type[BaseModel]]) -> dict[str, str]:
    """Refuse `sources:` entries that name no parameter of the spec (`key` or `key.sub`)."""
    known = set(spec_cls.model_fields) - {"name", "kind", "description", "sources"}
    known |= {f"{key}.{n}" for key, model in nested.items() for n in model.model_fields}
    unknown = sorted(set(sources) - known)
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    return sources


class MacArray(Strict):
    """Spatial unrolling of one core's MAC array: PEs = k x c x ox x oy x fx x fy."""

    k: PositiveInt = 1   # output channels (columns; inputs are broadcast along them)
    c: PositiveInt = 1   # input channels, or kernel taps for depthwise convs (reduction rows)
    ox: PositiveInt = 1  # output columns
    oy: PositiveInt = 1  # output rows
    fx: PositiveInt = 1  # kernel columns
    fy: PositiveInt = 1  # kernel rows

    @property
    def pes(self) -> int:
        return self.k * self.c * self.ox * self.oy * self.fx * self.fy

    @property
    def label(self) -> str:
        """The unrolled dimensions, e.g. k8-c8-ox4-oy4: a co-search knob's value."""
        return "-".join(f"{d}{n}" for d, n in self.model_dump().items() if n > 1) or "k1"


class EnergySpec(Strict):
    mult_pj: BitTable            # one multiply, by operand width
    add_pj: BitTable             # one add, by operand width
    sram_pj_per_byte: PositiveFloat
    dram_pj_per_byte: PositiveFloat
    noc_pj_per_byte: NonNegativeFloat
    static_mw: NonNegativeFloat = 0.0
    rf_pj_per_byte: NonNegativeFloat = 0.0      # PE register file, per operand byte of a MAC
    array_pj_per_byte: NonNegativeFloat = 0.0   # array network, per SRAM byte of a MAC-array layer
    weight_pj_per_byte: Optional[PositiveFloat] = None  # the weight memory, where there is one

    def mac_pj(self, bits: int) -> float:
        return self.mult_pj[bits] + self.add_pj[bits]


class AreaSpec(Strict):
    pe_mm2: PositiveFloat                # one PE of the MAC array
    vector_lane_mm2: PositiveFloat       # one lane of the vector unit
    sram_mm2_per_kib: PositiveFloat      # weight and activation SRAM
    router_mm2: NonNegativeFloat         # one core's on-chip network router (chips of 2+ cores)


class CoSearchSpec(Strict):
    """The choices a co-search gives each device knob."""

    cores: Annotated[list[PositiveInt], Field(min_length=1)]
    mac_array: Annotated[list[MacArray], Field(min_length=1)]
    weight_sram_kib: Annotated[list[PositiveInt], Field(min_length=1)]
    act_sram_kib: Annotated[list[PositiveInt], Field(min_length=1)]
    sram_energy_exponent: NonNegativeFloat  # SRAM energy per byte grows as (KiB per core) ^ this

    @field_validator("mac_array")
    @classmethod
    def _distinct(cls, v: list[MacArray]) -> list[MacArray]:
        labels = [u.label for u in v]
        if len(set(labels)) != len(labels):
            raise ValueError(f"lists an array twice: {', '.join(labels)}")
        return v


class AcceleratorSpec(Strict):
    name: str
    kind: Literal["analytical"]
    description: str = ""
    cores: PositiveInt
    clock_mhz: PositiveFloat
    mac_array: MacArray | Annotated[list[MacArray], Field(min_length=1)]  # per core; a list: alternatives
    macs_per_pe_cycle: BitTable          # throughput of one PE by operand width
    vector_lanes: PositiveInt            # vector-unit elements per cycle per core, x macs_per_pe_cycle
    weight_sram_kib: PositiveFloat       # per core
    act_sram_kib: PositiveFloat          # per core
    dram_gb_s: PositiveFloat
    weight_gb_s: Optional[PositiveFloat] = None  # weights stream from a memory of their own (e.g. flash)
    noc_gb_s: PositiveFloat
    energy: EnergySpec
    area: Optional[AreaSpec] = None      # per-unit silicon area: chip area and co-search
    co_search: Optional[CoSearchSpec] = None
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
        return check_sources(cls, v, {"mac_array": MacArray, "energy": EnergySpec, "area": AreaSpec,
                                      "co_search": CoSearchSpec})

    @model_validator(mode="after")
    def _weight_memory_complete(self) -> AcceleratorSpec:
        if (self.weight_gb_s is None) != (self.energy.weight_pj_per_byte is None):
            raise ValueError("weight_gb_s and energy.weight_pj_per_byte describe the weight memory: "
                             "give both or neither")
        if self.co_search is not None and self.area is None:
            raise ValueError("co_search needs an area section: chip area is one of its objectives")
        return self

    @property
    def area_mm2(self) -> float | None:
        """Chip area by the module docstring's formula; None without an area section."""
        a = self.area
        if a is None:
            return None
        pes = max(u.pes for u in self.unrollings)
        core = (pes * a.pe_mm2 + self.vector_lanes * a.vector_lane_mm2
                + (self.weight_sram_kib + self.act_sram_kib) * a.sram_mm2_per_kib
                + (a.router_mm2 if self.cores > 1 else 0.0))
        return self.cores * core

    @property
    def unrollings(self) -> tuple[MacArray, ...]:
        return tuple(self.mac_array) if isinstance(self.mac_array, list) else (self.mac_array,)


class AnalyticalAccelerator(CostModel):
    """A multi-core accelerator priced by the equations in this module's docstring."""

    def __init__(self, spec: AcceleratorSpec):
        self.spec = spec
        self.name = spec.name
        self._cache: dict[tuple, LayerCost | None] = {}
        self._derived: dict[tuple, AnalyticalAccelerator] = {}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnalyticalAccelerator:
        return cls(AcceleratorSpec.model_validate(data))

    @property
    def weight_capacity_bytes(self) -> int:
        """On-chip weight memory of all cores together."""
        return int(self.spec.cores * self.spec.weight_sram_kib * 1024)

    def describe(self) -> dict:
        s = self.spec
        params = s.model_dump(exclude={"name", "kind", "description", "sources"}, exclude_none=True)
        pes = max(u.pes for u in s.unrollings)
        peak = {b: round(2 * s.cores * pes * r * s.clock_mhz * 1e6 / 1e12, 3)
                for b, r in sorted(s.macs_per_pe_cycle.items())}
        extra = {} if s.area is None else {"area_mm2": round(s.area_mm2, 3)}
        return {"name": s.name, "kind": s.kind, "description": s.description, **params,
                "peak_tops_by_bits": peak, "weight_capacity_bytes": self.weight_capacity_bytes, **extra,
                "sources": dict(s.sources)}

    def co_search_knobs(self) -> dict[str, tuple]:
        """The device's knobs and their choices, from its spec's co_search section."""
        cs = self.spec.co_search
        if cs is None:
            raise UsageError(f"device '{self.name}' has no co_search section; --co-search needs one listing "
                             "choices for cores, mac_array, weight_sram_kib and act_sram_kib, and an area "
                             "section (see edge-quad)")
        return {"cores": tuple(cs.cores), "mac_array": tuple(u.label for u in cs.mac_array),
                "weight_sram_kib": tuple(cs.weight_sram_kib), "act_sram_kib": tuple(cs.act_sram_kib)}

    def derive(self, knobs: Mapping[str, Any]) -> AnalyticalAccelerator:
        """This accelerator with the co-search choices `knobs` (as `co_search_knobs` names
        them), its static power and SRAM energy scaled as the module docstring says; cached
        per choice."""
        key = tuple(sorted(knobs.items()))
        if key not in self._derived:
            s = self.spec
            arrays = {u.label: u for u in s.co_search.mac_array}
            spec = s.model_copy(update={**knobs, "mac_array": arrays[knobs["mac_array"]]})
            sram = (spec.weight_sram_kib + spec.act_sram_kib) / (s.weight_sram_kib + s.act_sram_kib)
            spec.energy = s.energy.model_copy(update={
                "static_mw": s.energy.static_mw * spec.area_mm2 / s.area_mm2,
                "sram_pj_per_byte": s.energy.sram_pj_per_byte * sram ** s.co_search.sram_energy_exponent})
            self._derived[key] = AnalyticalAccelerator(spec)
        return self._derived[key]

    def _layer_cost(self, layer: LayerSpec) -> LayerCost | None:
        key = layer.shape_key()
        if key not in self._cache:
            options = self.alternatives(layer)
            self._cache[key] = min(options, key=lambda c: c.latency_ms * c.energy_mj) if options else None
        return self._cache[key]

    def alternatives(self, layer: LayerSpec) -> list[LayerCost]:
        """The layer's cost under every mapping onto the cores; empty if it cannot be priced."""
        if layer.op not in OPS or self._width(layer) is None:
            return []
        options = [self._mapped(layer, 1, "")]
        for n in range(2, self.spec.cores + 1):
            if self.spec.cores % n == 0:
                if layer.out_ch >= n and layer.op not in _MIXES_CHANNELS:
                    options.append(self._mapped(layer, n, "K"))
                if positions(layer)[0] >= n:
                    options.append(self._mapped(layer, n, "OY"))
        return options

    def _width(self, layer: LayerSpec) -> int | None:
        """The smallest supported width holding the layer's operands, or None."""
        need = max(layer.w_bits, layer.a_bits) if layer.op in WEIGHTED_OPS else layer.a_bits
        return min((b for b in self.spec.macs_per_pe_cycle if b >= need), default=None)

    @staticmethod
    def _tiles(layer: LayerSpec, u: MacArray, k_c: int, g_c: int, py_c: int) -> int:
        """Unrolled tiles of a MAC-array layer on one core holding k_c output channels,
        g_c groups and py_c position rows."""
        kh, kw = layer.kernel
        spatial = ceil(positions(layer)[1] / u.ox) * ceil(py_c / u.oy)
        taps = ceil(kh / u.fy) * ceil(kw / u.fx)
        c_g = layer.in_ch // layer.groups
        if c_g == 1:
            return ceil(k_c / u.k) * ceil(taps / u.c) * spatial
        return g_c * ceil(ceil(k_c / g_c) / u.k) * ceil(c_g / u.c) * taps * spatial

    def _mapped(self, layer: LayerSpec, n: int, dim: str) -> LayerCost:
        s, e = self.spec, self.spec.energy
        bits = self._width(layer)
        mac = layer.op in MAC_OPS
        K, (PY, _), (kh, _) = layer.out_ch, positions(layer), layer.kernel
        G = layer.groups if mac else layer.in_ch  # vector ops are channel-wise
        W, B, I, O = layer.weight_bytes, second_operand_bytes(layer), layer.in_bytes, layer.out_bytes
        S = W + B  # the stationary operand

        # The busiest core's output channels, groups, position rows and share of the
        # input (vector ops); the bytes replicated across cores.
        k_c, g_c, py_c, share = K, G, PY, 1.0
        in_repl = s_repl = out_repl = 0.0
        if dim == "K":
            k_c, g_c, share = ceil(K / n), ceil(G / n), ceil(G / n) / G
            in_repl = I * (max(n / G, 1.0) - 1.0)
        elif dim == "OY":
            py_c = ceil(PY / n)
            halo = max(kh - layer.stride, 0)
            s_repl = (n - 1) * S
            if layer.op == "conv_transpose":  # each core owns input rows; overlapping output rows are summed
                out_h = layer.out_hw[0]
                out_repl = O * (n - 1) * min(halo, out_h) / out_h
            elif layer.op == "resize":
                share = py_c / PY
            else:
                in_h = layer.in_hw[0]
                share = min(in_h, (py_c - 1) * layer.stride + kh) / in_h
                in_repl = I * (n - 1) * min(halo, in_h) / in_h  # halo rows

        rate = s.macs_per_pe_cycle[bits]
        if mac:
            tiles = min(self._tiles(layer, u, k_c, g_c, py_c) for u in s.unrollings)
            ops_pj = layer.macs * e.mac_pj(bits)
        else:
            elems, adds, mults = vector_work(layer)
            tiles = ceil(elems * share * max(adds + mults, 1) / s.vector_lanes)
            ops_pj = elems * (adds * e.add_pj[bits] + mults * e.mult_pj[bits])
        t_comp = tiles / rate / (s.clock_mhz * 1e6)

        s_read, in_read = S + s_repl, I + in_repl
        passes = max(1, ceil(s_read / n / (s.weight_sram_kib * 1024)))
        spill = (in_read + O + B) / n > s.act_sram_kib * 1024
        acts = (I * passes + O + B) if spill else 0.0
        dram = acts if s.weight_gb_s else W + acts
        noc = in_repl + s_repl + out_repl
        sram = s_read + in_read * passes + O + out_repl

        t_mem = dram / (s.dram_gb_s * 1e9)
        energy_pj = (ops_pj + sram * e.sram_pj_per_byte + dram * e.dram_pj_per_byte
                     + noc * e.noc_pj_per_byte)
        if s.weight_gb_s:
            t_mem = max(t_mem, W / (s.weight_gb_s * 1e9))
            energy_pj += W * e.weight_pj_per_byte
        if mac:
            energy_pj += 4 * layer.macs * bits / 8 * e.rf_pj_per_byte + sram * e.array_pj_per_byte
        latency_s = max(t_comp, t_mem) + noc / (s.noc_gb_s * 1e9)
        energy_pj += e.static_mw * 1e-3 * latency_s * 1e12
        return LayerCost(latency_s * 1e3, energy_pj * 1e-9, f"{n}x{dim}" if dim else "1")
