"""Pricing an analytical device's conv layers with ZigZag, a second, finer model.

ZigZag (KU Leuven MICAS, github.com/KULeuven-MICAS/zigzag; the optional extra
`pip install 'nasctl[zigzag]'`, PyPI `zigzag-dse`) searches the temporal mapping of one
layer - loop order and which memory level holds which loop - on an accelerator given as a
memory hierarchy and an operational array, and reports its latency in cycles and its
energy.  The accelerator handed to it is ZigZag's own `edge_tpu_like` (the core edge-quad
and edge-single are modelled on) with the device's core put in:

  operational array   the device's MAC array, k x c x ox x oy (one unrolling, no fx/fy)
  weight SRAM         weight_sram_kib (ZigZag's sram_32KB level)
  activation SRAM     act_sram_kib (ZigZag's sram_2MB level)
  DRAM port           dram_gb_s / clock, in bits per cycle; DRAM holds the weights, and
                      the activations only of a layer whose input and output exceed the
                      activation SRAM (as the analytical model keeps them on chip otherwise)
  register files      one weight (w_bits) per PE, one partial sum of 2 x a_bits (at least 16)

Memory and MAC energies stay edge_tpu_like's figures (ZigZag's units, reported as pJ).
The spatial mapping is the device's unrolling: K, C, OX, OY on the array's four
dimensions; a depthwise conv unrolls its channels (G) where the array has K and as many
kernel taps (FX, then FY) as fit where it has C, as the analytical model does.  ZigZag
keeps the mapping of least energy-delay product among those it searches, with a lighter
search than its default (loop prime factors merged down to `LPF_LIMIT`).  On a
multi-core device a layer is split over all cores along its output channels (groups for
a grouped conv) when it has enough of them, each core running its share at once: the
latency of one share, the energy of all (the input broadcast between cores is not
priced).
"""

from __future__ import annotations

import logging
import tempfile
from importlib import resources
from math import ceil
from pathlib import Path
from typing import Sequence

import yaml

from ..errors import UsageError
from .accelerator import AnalyticalAccelerator
from .base import CostModel, LayerCost
from .layers import LayerSpec

INSTALL_HINT = "pip install 'nasctl[zigzag]'"
LPF_LIMIT = 2  # ZigZag raises it to each layer's count of temporal loops
_EQUATION = "O[b][g][k][oy][ox]+=W[g][k][c][fy][fx]*I[b][g][c][iy][ix]"


def _api():
    try:
        from zigzag import api
    except ImportError:
        raise UsageError(f"the zigzag backend needs ZigZag (zigzag-dse), which is not installed; "
                         f"install it with: {INSTALL_HINT}") from None
    return api


def _checked(device: CostModel) -> AnalyticalAccelerator:
    if not isinstance(device, AnalyticalAccelerator):
        raise UsageError(f"the zigzag backend prices analytical devices; '{device.name}' is not one")
    units = device.spec.unrollings
    if len(units) != 1 or units[0].fx != 1 or units[0].fy != 1:
        raise UsageError(f"the zigzag backend maps a k x c x ox x oy MAC array; device '{device.name}' "
                         f"unrolls its array otherwise")
    return device


def _accelerator(device: AnalyticalAccelerator, w_bits: int, psum_bits: int, spill: bool) -> dict:
    s, u = device.spec, device.spec.unrollings[0]
    template = resources.files("zigzag") / "inputs" / "hardware" / "edge_tpu_like.yaml"
    hw = yaml.safe_load(template.read_text(encoding="utf-8"))
    hw["name"] = f"{s.name}_core"
    hw["operational_array"]["sizes"] = [u.k, u.c, u.ox, u.oy]
    mem = hw["memories"]
    for level, bits in (("rf_1B", w_bits), ("rf_2B", psum_bits)):
        mem[level]["size"] = bits
        for port in mem[level]["ports"]:
            port["bandwidth_min"] = port["bandwidth_max"] = bits
    mem["sram_32KB"]["size"] = int(s.weight_sram_kib * 1024 * 8)
    mem["sram_2MB"]["size"] = int(s.act_sram_kib * 1024 * 8)
    dram_bits = max(8, int(s.dram_gb_s * 8e9 / (s.clock_mhz * 1e6)))
    for port in mem["dram"]["ports"]:
        port["bandwidth_min"] = port["bandwidth_max"] = dram_bits
        if not spill:
            port["allocation"] = [a for a in port["allocation"] if a.startswith("I2")]
    if not spill:
        mem["dram"]["operands"] = ["I2"]
    return hw


def _share(layer: LayerSpec, cores: int) -> tuple[LayerSpec, int]:
    """One core's share of the layer split along output channels (groups), and the split."""
    n = cores if layer.out_ch >= cores and (layer.groups == 1 or layer.groups >= cores) else 1
    if n == 1:
        return layer, 1
    if layer.groups > 1:
        g = ceil(layer.groups / n)
        per = layer.out_ch // layer.groups
        return LayerSpec("conv", g * (layer.in_ch // layer.groups), g * per, layer.in_hw, layer.out_hw,
                         layer.kernel, layer.stride, g, layer.w_bits, layer.a_bits), n
    return LayerSpec("conv", layer.in_ch, ceil(layer.out_ch / n), layer.in_hw, layer.out_hw, layer.kernel,
                     layer.stride, 1, layer.w_bits, layer.a_bits), n


def _workload_layer(i: int, layer: LayerSpec, psum_bits: int) -> dict:
    (ih, iw), (oh, ow), (kh, kw), st = layer.in_hw, layer.out_hw, layer.kernel, layer.stride
    pad_h, pad_w = max(0, (oh - 1) * st + kh - ih), max(0, (ow - 1) * st + kw - iw)
    return {"id": i, "name": f"L{i}", "operator_type": "Conv", "equation": _EQUATION,
            "dimension_relations": [f"ix={st}*ox+1*fx", f"iy={st}*oy+1*fy"],
            "loop_dims": ["B", "K", "G", "OX", "OY", "C", "FX", "FY"],
            "loop_sizes": [1, layer.out_ch // layer.groups, layer.groups, ow, oh, layer.in_ch // layer.groups,
                           kw, kh],
            "operand_precision": {"W": layer.w_bits, "I": layer.a_bits, "O_final": layer.a_bits, "O": psum_bits},
            "operand_source": {},
            "pr_loop_dims": ["IX", "IY"], "pr_loop_sizes": [iw, ih],
            "padding": [[pad_w // 2, pad_w - pad_w // 2], [pad_h // 2, pad_h - pad_h // 2]]}


def _mapping(device: AnalyticalAccelerator, layers: Sequence[LayerSpec]) -> list[dict]:
    u = device.spec.unrollings[0]
    links = {"O": "O", "W": "I2", "I": "I1"}
    out = [{"name": "default", "memory_operand_links": links,
            "spatial_mapping": {"D1": [f"K, {u.k}"], "D2": [f"C, {u.c}"], "D3": [f"OX, {u.ox}"],
                                "D4": [f"OY, {u.oy}"]}}]
    for i, layer in enumerate(layers):
        if layer.in_ch // layer.groups == 1 and layer.groups > 1:  # depthwise: taps on the C rows
            kh, kw = layer.kernel
            fx = min(kw, u.c)
            fy = min(kh, max(1, u.c // fx))
            out.append({"name": f"L{i}", "memory_operand_links": links,
                        "spatial_mapping": {"D1": [f"G, {u.k}"], "D2": [f"FX, {fx}", f"FY, {fy}"],
                                            "D3": [f"OX, {u.ox}"], "D4": [f"OY, {u.oy}"]}})
    return out


def zigzag_costs(device: CostModel, layers: Sequence[LayerSpec]) -> list[LayerCost]:
    """ZigZag's latency and energy of each conv layer (one call per operand width)."""
    accel = _checked(device)
    api = _api()
    if any(layer.op != "conv" for layer in layers):
        raise ValueError("zigzag_costs prices conv layers only")
    clock_hz = accel.spec.clock_mhz * 1e6
    shares = [_share(layer, accel.spec.cores) for layer in layers]
    costs: list[LayerCost | None] = [None] * len(layers)
    act_sram = accel.spec.act_sram_kib * 1024
    by_width: dict[tuple[int, int, bool], list[int]] = {}
    for i, (share, _) in enumerate(shares):
        spill = share.in_bytes + share.out_bytes > act_sram
        by_width.setdefault((max(8, share.w_bits), max(16, 2 * share.a_bits), spill), []).append(i)
    root, guard = logging.getLogger(), logging.NullHandler()
    root.addHandler(guard)          # ZigZag calls logging.basicConfig(), a no-op on a configured root,
    logging.disable(logging.WARNING)  # and logs every stage at INFO and every reduced unrolling
    try:
        for (w_bits, psum_bits, spill), idx in by_width.items():
            part = [shares[i][0] for i in idx]
            with tempfile.TemporaryDirectory() as tmp:
                hw, mapping = Path(tmp, "accelerator.yaml"), Path(tmp, "mapping.yaml")
                hw.write_text(yaml.safe_dump(_accelerator(accel, w_bits, psum_bits, spill), sort_keys=False))
                mapping.write_text(yaml.safe_dump(_mapping(accel, part), sort_keys=False))
                workload = [_workload_layer(j, layer, psum_bits) for j, layer in enumerate(part)]
                *_, cmes = api.get_hardware_performance_zigzag(
                    workload, str(hw), str(mapping), opt="EDP", dump_folder=str(Path(tmp, "out")),
                    lpf_limit=LPF_LIMIT, loma_show_progress_bar=False)
            for cme, _ in cmes[0][1]:
                i = idx[int(cme.layer.name[1:])]
                n = shares[i][1]
                costs[i] = LayerCost(cme.latency_total2 / clock_hz * 1e3, n * cme.energy_total * 1e-9,
                                     f"{n}xK (ZigZag)" if n > 1 else "1 (ZigZag)")
    finally:
        logging.disable(logging.NOTSET)
        root.removeHandler(guard)
    return costs  # type: ignore[return-value]
