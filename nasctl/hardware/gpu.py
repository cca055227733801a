"""`kind: gpu` - a roofline model of a datacenter GPU with tile and wave quantisation.

MAC layers run as (implicit) GEMMs on the tensor cores: a conv of K output channels,
C_g input channels per group and kh x kw taps over P output positions is `groups` GEMMs
of M = P, N = K / groups, reduction R = C_g x kh x kw (conv_transpose: P its input
positions, N its output channels per group; linear and matmul: M positions, N out_ch,
R in_ch).  The output of each GEMM is cut into tile_m x tile_n tiles, one thread block
(CTA) each; the SMs run one CTA at a time, so the tiles run in waves:

  tiles    = groups x ceil(M / tile_m) x ceil(N / tile_n)
  waves    = ceil(tiles / sms)
  split    = max(1, sms // tiles)   (split-K: a GEMM of fewer tiles than SMs shares its
                                     reduction among floor(sms / tiles) CTAs per tile)
  t_comp   = waves x 2 x tile_m x tile_n x ceil(R / split) / (tensor_tflops[b] / sms)

- latency is a step function of the tile count, with a step of one wave at every
multiple of the SM count.  Depthwise convs (C_g = 1) do not fit a GEMM; like every
other op (pool, add, mul, act, softmax, norm, resize, concat, split, data) they run on
the CUDA cores: t_comp = work / vector_tflops[b], work = 2 x MACs for depthwise convs
and E x (adds + multiplies) for the rest (`accelerator.vector_work`: E = max(input, output
elements); data movement has none).  Every kernel reads its inputs and weights from HBM
and writes its output back once (W + I + O, plus matmul's second operand B):

  t_mem    = bytes / hbm bandwidth
  latency  = launch overhead + max(t_comp, t_mem)
  energy   = idle_w x latency + (tdp_w - idle_w) x max(useful flops / peak, bytes / bandwidth)

i.e. the board draws idle power for the whole kernel and up to its TDP in proportion to
how busy the limiting resource is (u = the roofline utilisation of the useful work; a
kernel running its compute or memory at peak for its whole latency draws the TDP).
b is the operand width (4, 8, 16, 32: int4, int8/fp8, bf16/fp16, fp32), priced at the
smallest width the spec lists that holds it.  Costs are cached per `LayerSpec.shape_key()`.
"""

from __future__ import annotations

from math import ceil
from typing import Any, Literal

from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from .accelerator import (WEIGHTED_OPS, BitTable, Strict, check_sources, positions, second_operand_bytes,
                          vector_work)
from .base import CostModel, LayerCost
from .layers import MAC_OPS, OPS, LayerSpec


class GpuSpec(Strict):
    name: str
    kind: Literal["gpu"]
    description: str = ""
    sms: PositiveInt                 # streaming multiprocessors
    tensor_tflops: BitTable          # dense GEMM peak by operand width (flops = 2 x MACs)
    vector_tflops: BitTable          # CUDA-core peak by operand width
    tile_m: PositiveInt              # GEMM output tile of one CTA: rows (positions) ...
    tile_n: PositiveInt              # ... x columns (output channels)
    hbm_gb_s: PositiveFloat
    launch_us: NonNegativeFloat      # fixed cost of every kernel
    tdp_w: PositiveFloat
    idle_w: NonNegativeFloat
    sources: dict[str, str] = {}     # parameter -> its public source or assumption

    @field_validator("sources")
    @classmethod
    def _known_parameters(cls, v: dict[str, str]) -> dict[str, str]:
        return check_sources(cls, v, {})

    @model_validator(mode="after")
    def _consistent(self) -> GpuSpec:
        if set(self.tensor_tflops) != set(self.vector_tflops):
            raise ValueError(f"tensor_tflops and vector_tflops must list the same bit widths; got "
                             f"{sorted(self.tensor_tflops)} and {sorted(self.vector_tflops)}")
        if self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w ({self.idle_w}) must be below tdp_w ({self.tdp_w})")
        return self


class GpuRoofline(CostModel):
    """A GPU priced by the equations in this module's docstring."""

    def __init__(self, spec: GpuSpec):
        self.spec = spec
        self.name = spec.name
        self._cache: dict[tuple, LayerCost | None] = {}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuRoofline:
        return cls(GpuSpec.model_validate(data))

    def describe(self) -> dict:
        s = self.spec
        params = s.model_dump(exclude={"name", "kind", "description", "sources"})
        ridge = {b: round(t * 1e12 / (s.hbm_gb_s * 1e9), 1) for b, t in sorted(s.tensor_tflops.items())}
        return {"name": s.name, "kind": s.kind, "description": s.description, **params,
                "ridge_flops_per_byte": ridge, "sources": dict(s.sources)}

    def _layer_cost(self, layer: LayerSpec) -> LayerCost | None:
        key = layer.shape_key()
        if key not in self._cache:
            self._cache[key] = self._price(layer)
        return self._cache[key]

    def _width(self, layer: LayerSpec) -> int | None:
        need = max(layer.w_bits, layer.a_bits) if layer.op in WEIGHTED_OPS else layer.a_bits
        return min((b for b in self.spec.tensor_tflops if b >= need), default=None)

    def gemm_tiles(self, layer: LayerSpec) -> tuple[int, int]:
        """(output tiles, reduction length) of a MAC layer run as a GEMM."""
        s = self.spec
        py, px = positions(layer)
        n_g = layer.out_ch // layer.groups
        reduction = layer.in_ch // layer.groups * layer.kernel[0] * layer.kernel[1]
        return layer.groups * ceil(py * px / s.tile_m) * ceil(n_g / s.tile_n), reduction

    def _price(self, layer: LayerSpec) -> LayerCost | None:
        s = self.spec
        bits = self._width(layer)
        if layer.op not in OPS or bits is None:
            return None
        bytes_ = layer.weight_bytes + second_operand_bytes(layer) + layer.in_bytes + layer.out_bytes
        depthwise = layer.op in MAC_OPS and layer.in_ch // layer.groups == 1 and layer.groups > 1
        if layer.op in MAC_OPS and not depthwise:
            peak = s.tensor_tflops[bits] * 1e12
            tiles, reduction = self.gemm_tiles(layer)
            waves, split = ceil(tiles / s.sms), max(1, s.sms // tiles)
            t_comp = waves * 2 * s.tile_m * s.tile_n * ceil(reduction / split) / (peak / s.sms)
            flops, unit = 2 * layer.macs, f"tensor cores, {tiles} tiles in {waves} waves"
        else:
            if depthwise:
                flops = 2 * layer.macs
            else:
                elems, adds, mults = vector_work(layer)
                flops = elems * (adds + mults)
            peak = s.vector_tflops[bits] * 1e12
            t_comp, unit = flops / peak, "CUDA cores"
        t_mem = bytes_ / (s.hbm_gb_s * 1e9)
        latency = s.launch_us * 1e-6 + max(t_comp, t_mem)
        busy = max(flops / peak, t_mem)  # seconds of the limiting resource at peak
        energy = s.idle_w * latency + (s.tdp_w - s.idle_w) * busy
        bound = "compute" if t_comp >= t_mem else "memory"
        return LayerCost(latency * 1e3, energy * 1e3, f"{unit}, {bound}-bound")
