import copy
import itertools
from math import ceil
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from nasctl.hardware.accelerator import AnalyticalAccelerator
from nasctl.hardware.layers import LayerSpec
from nasctl.spaces.mbv2 import Mbv2Space

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "hardware" / "edge-quad.yaml").read_text())


def device(**changes) -> AnalyticalAccelerator:
    data = copy.deepcopy(SPEC)
    data.update(changes)
    return AnalyticalAccelerator.from_dict(data)


def conv(cin, cout, hw, k=3, stride=1, bits=8, depthwise=False):
    out = (hw + 2 * (k // 2) - k) // stride + 1
    groups = cin if depthwise else 1
    return LayerSpec("conv", cin, cin if depthwise else cout, (hw, hw), (out, out), (k, k), stride, groups,
                     bits, bits)


def edp(cost):
    return cost.latency_ms * cost.energy_mj


def test_hand_worked_conv():
    """3x3 conv 12 -> 20 on 6x6, int8: 1 core, and split 4 ways over output channels."""
    quad = device()
    layer = conv(12, 20, 6)
    by_map = {c.mapping: c for c in quad.alternatives(layer)}
    assert set(by_map) == {"1", "2xK", "2xOY", "4xK", "4xOY"}

    macs = 6 * 6 * 20 * 12 * 9                                    # 77,760
    W, I, O = 20 * 12 * 9 + 20, 12 * 36, 20 * 36                  # bytes at 8 bits: 2180, 432, 720
    mac_pj, sram_pj, dram_pj, noc_pj = 0.2 + 0.03, 12.5, 243.75, 1.6
    static_w, clock_hz, dram_bps, noc_bps = 0.2, 500e6, 12.8e9, 32e9

    # 1 core: ceil(20/8) x ceil(12/8) x ceil(6/4) x ceil(6/4) x 9 taps = 216 cycles,
    # compute-bound (432 ns) over the weights' DRAM time (2180 B / 12.8 GB/s = 170 ns).
    lat = max(3 * 2 * 2 * 2 * 9 / clock_hz, W / dram_bps)
    energy = macs * mac_pj + (W + I + O) * sram_pj + W * dram_pj + static_w * lat * 1e12
    assert by_map["1"].latency_ms == pytest.approx(lat * 1e3)
    assert by_map["1"].energy_mj == pytest.approx(energy * 1e-9)

    # 4xK: 5 output channels a core, 72 cycles (144 ns) - now the weights' DRAM time
    # bounds it - plus the input broadcast to the 3 other cores over the NoC.
    noc = 3 * I
    lat = max(1 * 2 * 2 * 2 * 9 / clock_hz, W / dram_bps) + noc / noc_bps
    energy = (macs * mac_pj + (W + I + noc + O) * sram_pj + W * dram_pj + noc * noc_pj
              + static_w * lat * 1e12)
    assert by_map["4xK"].latency_ms == pytest.approx(lat * 1e3)
    assert by_map["4xK"].energy_mj == pytest.approx(energy * 1e-9)

    # 2xOY: 3 output rows a core, 3 x 2 x 9 x 2 x 1 = 108 cycles (216 ns); the weights
    # go to the second core, and so do the 3 - 1 = 2 halo input rows (2/6 of the input).
    w_copy, halo = W, I * 2 / 6
    noc = w_copy + halo
    lat = max(3 * 2 * 9 * 2 * 1 / clock_hz, W / dram_bps) + noc / noc_bps
    energy = (macs * mac_pj + (W + w_copy + I + halo + O) * sram_pj + W * dram_pj + noc * noc_pj
              + static_w * lat * 1e12)
    assert by_map["2xOY"].latency_ms == pytest.approx(lat * 1e3)
    assert by_map["2xOY"].energy_mj == pytest.approx(energy * 1e-9)
    assert quad._layer_cost(layer) == min(by_map.values(), key=edp)


def test_hand_worked_vector_op():
    """A residual add of two 24 x 32 x 32 int8 tensors runs on the 8-lane vector units."""
    quad = device()
    add = LayerSpec("add", 24, 24, (32, 32), (32, 32), w_bits=8, a_bits=8)
    by_map = {c.mapping: c for c in quad.alternatives(add)}
    elems, out = 2 * 24 * 1024, 24 * 1024                  # 1 byte each
    for n in (1, 4):  # 4xK: each core adds its own 6 channels, nothing is exchanged
        lat = elems / n / 8 / 500e6
        energy = elems * 0.03 + (elems + out) * 12.5 + 0.2 * lat * 1e12
        cost = by_map["1" if n == 1 else "4xK"]
        assert cost.latency_ms == pytest.approx(lat * 1e3)
        assert cost.energy_mj == pytest.approx(energy * 1e-9)


def test_weights_beyond_the_weight_sram_restream_the_input():
    # 1x1 conv 64 -> 64 on 8x8, int8: 4160 weight bytes; with a 1 KiB weight SRAM the input
    # (4096 bytes) is read once per 1 KiB of weights, 5 times instead of once.
    layer = conv(64, 64, 8, k=1)
    roomy, tight = device(cores=1)._layer_cost(layer), device(cores=1, weight_sram_kib=1)._layer_cost(layer)
    assert tight.latency_ms == roomy.latency_ms
    assert tight.energy_mj - roomy.energy_mj == pytest.approx(4 * 4096 * 12.5 * 1e-9)


def test_spec_loads_with_a_source_for_every_parameter():
    quad = device()
    info = quad.describe()
    assert info["name"] == "edge-quad" and info["cores"] == 4
    assert info["peak_tops_by_bits"][8] == pytest.approx(4.096)
    nested = {"energy", "area", "co_search"}
    params = {k for k in SPEC if k not in {"name", "kind", "description", "sources", *nested}}
    params |= {f"{section}.{k}" for section in nested for k in SPEC[section]}
    assert params == set(info["sources"])
    assert quad.weight_capacity_bytes == 4 * 1024 * 1024


def _growth_pairs(bits):
    """(layer, the same layer grown along one dimension) over a sweep of conv shapes."""
    channels, sizes, kernels = [3, 8, 9, 24, 48, 96, 576], [1, 4, 7, 8, 16, 32], [1, 3, 5]
    grow = lambda seq, x: seq[min(seq.index(x) + 1, len(seq) - 1)]  # noqa: E731
    for cin, cout, hw, k, stride in itertools.product(channels, channels, sizes, kernels, (1, 2)):
        if k > hw:
            continue
        small = conv(cin, cout, hw, k, stride, bits)
        yield small, conv(grow(channels, cin), cout, hw, k, stride, bits)
        yield small, conv(cin, grow(channels, cout), hw, k, stride, bits)
        yield small, conv(cin, cout, grow(sizes, hw), k, stride, bits)
        if grow(kernels, k) <= hw:
            yield small, conv(cin, cout, hw, grow(kernels, k), stride, bits)
        if cout == cin:
            dw = conv(cin, cin, hw, k, stride, bits, depthwise=True)
            yield dw, conv(grow(channels, cin), 0, hw, k, stride, bits, depthwise=True)
            yield dw, conv(cin, 0, grow(sizes, hw), k, stride, bits, depthwise=True)


@pytest.mark.parametrize("bits", [8, 32])
def test_more_macs_never_cheaper(bits):
    """Growing a layer never makes any mapping of it faster or cheaper, nor the chosen EDP lower.

    (The chosen mapping may trade latency for energy as a layer grows, so latency and energy
    are compared per mapping, and their product for the chosen one.)"""
    quad = device()
    for small, big in _growth_pairs(bits):
        assert big.macs >= small.macs
        before = {c.mapping: c for c in quad.alternatives(small)}
        for after in quad.alternatives(big):
            if after.mapping in before:
                assert after.latency_ms >= before[after.mapping].latency_ms * (1 - 1e-12), (small, big)
                assert after.energy_mj >= before[after.mapping].energy_mj * (1 - 1e-12), (small, big)
        assert edp(quad._layer_cost(big)) >= edp(quad._layer_cost(small)) * (1 - 1e-12), (small, big)


def test_fewer_bits_never_cost_more():
    quad = device()
    shapes = [(3, 16, 32, 3), (16, 48, 32, 1), (96, 576, 8, 1), (128, 128, 32, 3), (576, 96, 64, 1)]
    for cin, cout, hw, k in shapes:
        for depthwise in (False, True):
            costs = [quad._layer_cost(conv(cin, cout, hw, k, bits=b, depthwise=depthwise)) for b in (4, 8, 16, 32)]
            for lower, higher in zip(costs, costs[1:]):
                assert lower.energy_mj < higher.energy_mj
                assert lower.latency_ms <= higher.latency_ms
    fc = [quad._layer_cost(LayerSpec("linear", 128, 10, (1, 1), (1, 1), w_bits=b, a_bits=b)) for b in (4, 8, 16, 32)]
    assert all(lo.energy_mj < hi.energy_mj for lo, hi in zip(fc, fc[1:]))


def test_four_cores_beat_one_on_a_large_layer():
    layer = conv(128, 128, 32)
    quad, single = device()._layer_cost(layer), device(cores=1)._layer_cost(layer)
    assert single.mapping == "1" and quad.mapping != "1"
    assert quad.latency_ms < single.latency_ms / 2
    assert edp(quad) < edp(single)


def test_chosen_mapping_has_least_edp():
    quad = device()
    space = Mbv2Space.from_dict(yaml.safe_load((ROOT / "search_spaces" / "ee-mbv2.yaml").read_text()))
    rng = np.random.default_rng(0)
    chosen = set()
    for _ in range(20):
        for layer in space.to_layers(space.sample(rng), (3, 32, 32), 10):
            cost = quad._layer_cost(layer)
            best = min(quad.alternatives(layer), key=edp)
            assert cost.mapping == best.mapping and edp(cost) == edp(best)
            chosen.add(cost.mapping)
    assert len(chosen) >= 3  # the choice depends on the layer


def test_depthwise_loses_array_utilisation():
    # Same MACs (1,179,648): a 3x3 depthwise conv over 128 channels and a dense 1x1 conv 72 -> 16.
    single = device(cores=1)
    dw, dense = conv(128, 128, 32, depthwise=True), conv(72, 16, 32, k=1)
    assert dw.macs == dense.macs
    # depthwise: ceil(128/8) x ceil(9 taps/8) x 8 x 8 = 2048 cycles; dense: 2 x 9 x 8 x 8 = 1152
    assert single._layer_cost(dw).latency_ms == pytest.approx(2048 / 500e6 * 1e3)
    assert single._layer_cost(dense).latency_ms == pytest.approx(1152 / 500e6 * 1e3)
    quad = device()
    assert dw.macs / quad._layer_cost(dw).latency_ms < dense.macs / quad._layer_cost(dense).latency_ms
    # split over channels, each core convolves its own 32 channels: no input is exchanged
    split = {c.mapping: c for c in quad.alternatives(dw)}["4xK"]
    assert split.latency_ms == pytest.approx(4 * 2 * 8 * 8 / 500e6 * 1e3)


def test_activations_beyond_sram_make_a_layer_memory_bound():
    quad = device()
    fits, spills = conv(32, 32, 32, k=1), conv(32, 32, 512, k=1)  # 32 KiB vs 8 MiB of input
    assert spills.in_bytes + spills.out_bytes > 4 * SPEC["act_sram_kib"] * 1024
    per_mac = lambda layer: quad._layer_cost(layer).latency_ms / layer.macs  # noqa: E731
    assert per_mac(spills) > 5 * per_mac(fits)
    # memory-bound: input and output cross the DRAM channel
    dram_s = (spills.weight_bytes + spills.in_bytes + spills.out_bytes) / 12.8e9
    assert quad._layer_cost(spills).latency_ms >= dram_s * 1e3


def test_costs_are_cached_per_shape():
    quad = device()
    a = conv(16, 32, 8)
    b = LayerSpec(**{**{f: getattr(a, f) for f in a.__dataclass_fields__}, "name": "other", "segment": 2})
    assert quad._layer_cost(a) is quad._layer_cost(b)


def test_unsupported_op_and_width_are_reported():
    quad = device()
    layers = [conv(8, 8, 8), LayerSpec("lstm", 10, 10, (1, 1), (1, 1)),
              LayerSpec("linear", 8, 8, (1, 1), (1, 1), w_bits=64, a_bits=64)]
    report = quad.estimate(layers)
    assert dict(report.unsupported) == {"lstm": 1, "linear": 1}
    assert report.costs[0].latency_ms > 0
    # a width narrower than any supported runs at the narrowest one (its bytes stay packed)
    two, four = quad._layer_cost(conv(8, 8, 8, bits=2)), quad._layer_cost(conv(8, 8, 8, bits=4))
    assert two is not None and two.energy_mj <= four.energy_mj
    assert quad._layer_cost(LayerSpec("pool", 8, 8, (4, 4), (1, 1), (4, 4))).mapping.endswith("K")


def preset(name: str, **changes) -> AnalyticalAccelerator:
    data = yaml.safe_load((ROOT / "hardware" / f"{name}.yaml").read_text())
    data.update(changes)
    return AnalyticalAccelerator.from_dict(data)


def test_hand_worked_matmul():
    """Attention scores: 16 tokens x 64 features times 64 x 16, int8, on one core.  Both
    operands are activations: nothing comes from DRAM, the second operand is read from SRAM."""
    single = device(cores=1)
    layer = LayerSpec("matmul", 64, 16, (16, 1), (16, 1), w_bits=8, a_bits=8)
    assert layer.weight_bytes == 0
    cost = single._layer_cost(layer)
    # ceil(16/8) K x ceil(64/8) C x ceil(1/4) OX x ceil(16/4) OY = 64 cycles; no DRAM traffic
    lat = 64 / 500e6
    A, B, O = 64 * 16, 64 * 16, 16 * 16
    energy = 16 * 64 * 16 * 0.23 + (B + A + O) * 12.5 + 0.2 * lat * 1e12
    assert cost.latency_ms == pytest.approx(lat * 1e3)
    assert cost.energy_mj == pytest.approx(energy * 1e-9)
    # split over output rows, every core needs the whole second operand
    quad = {c.mapping: c for c in device().alternatives(layer)}
    assert quad["4xOY"].latency_ms == pytest.approx((2 * 8 * 1 * 1 / 500e6 + 3 * B / 32e9) * 1e3)


def test_hand_worked_conv_transpose():
    """3x3 stride-2 transposed conv 16 -> 8 from 8x8 to 16x16 (padding 1, output padding 1), int8."""
    layer = LayerSpec("conv_transpose", 16, 8, (8, 8), (16, 16), (3, 3), 2, 1, 8, 8)
    assert layer.macs == 8 * 8 * 16 * 8 * 9
    by_map = {c.mapping: c for c in device().alternatives(layer)}
    # over the 8x8 input positions: ceil(8/8) K x ceil(16/8) C x 2 x 2 x 9 taps = 72 cycles (144 ns),
    # bounded by the weights' DRAM time (1160 B / 12.8 GB/s = 91 ns) no more
    W, I, O = 8 * 16 * 9 + 8, 16 * 64, 8 * 256
    lat = 72 / 500e6
    energy = layer.macs * 0.23 + (W + I + O) * 12.5 + W * 243.75 + 0.2 * lat * 1e12
    assert by_map["1"].latency_ms == pytest.approx(lat * 1e3)
    assert by_map["1"].energy_mj == pytest.approx(energy * 1e-9)
    # 2xOY: each core scatters 4 input rows; the 3 - 2 = 1 overlapping output row is sent across
    out_rows = O * 1 / 16
    lat = max(2 * 2 * 1 * 9 / 500e6, W / 12.8e9) + (W + out_rows) / 32e9
    assert by_map["2xOY"].latency_ms == pytest.approx(lat * 1e3)


@pytest.mark.parametrize("layer, adds, mults", [
    (LayerSpec("softmax", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8), 5, 3),
    (LayerSpec("norm", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8, fn="layer"), 4, 3),
    (LayerSpec("norm", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8, fn="batch"), 1, 1),
    (LayerSpec("act", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8, fn="relu"), 1, 0),
    (LayerSpec("act", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8, fn="gelu"), 2, 2),
    (LayerSpec("mul", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8), 0, 1),
    (LayerSpec("resize", 16, 16, (16, 1), (32, 1), w_bits=8, a_bits=8, fn="linear"), 3, 4),
    (LayerSpec("resize", 16, 16, (16, 1), (32, 1), w_bits=8, a_bits=8, fn="nearest"), 0, 0),
    (LayerSpec("data", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8, fn="transpose"), 0, 0),
    (LayerSpec("concat", 16, 16, (32, 1), (32, 1), w_bits=8, a_bits=8), 0, 0),
])
def test_hand_worked_vector_ops(layer, adds, mults):
    """Vector ops on one core: E = max(input, output elements) through 8 lanes, once per
    operation (once when there is only data to move); each operation priced at int8."""
    cost = device(cores=1)._layer_cost(layer)
    elems = max(layer.in_elems, layer.out_elems)
    lat = ceil(elems * max(adds + mults, 1) / 8) / 500e6
    energy = elems * (adds * 0.03 + mults * 0.2) + (layer.in_bytes + layer.out_bytes) * 12.5 + 0.2 * lat * 1e12
    assert cost.latency_ms == pytest.approx(lat * 1e3)
    assert cost.energy_mj == pytest.approx(energy * 1e-9)


def test_channel_mixing_ops_split_over_rows_only():
    quad = device()
    for op in ("softmax", "norm", "data"):
        maps = {c.mapping for c in quad.alternatives(LayerSpec(op, 64, 64, (32, 1), (32, 1), w_bits=8, a_bits=8))}
        assert maps == {"1", "2xOY", "4xOY"}, op
    maps = {c.mapping for c in quad.alternatives(LayerSpec("act", 64, 64, (32, 1), (32, 1), fn="relu"))}
    assert "4xK" in maps


def test_reconfigured_array_and_per_level_energies():
    """eyeriss-like: a 3x3 conv 8 -> 16 on 14x14 at 16 bits takes the unrolling with 3 filter
    rows x 4 channel sets on the 12 PE rows and 14 output rows on the columns; energy adds
    4 register-file accesses per MAC and the array network for every buffer byte."""
    eyeriss = preset("eyeriss-like")
    layer = conv(8, 16, 14, k=3, bits=16)
    cost = eyeriss._layer_cost(layer)
    # 16 filters x ceil(8/4) x ceil(3/3) x 3 kernel columns x 14 columns x ceil(14/14) = 1344 cycles
    lat = 1344 / 200e6
    macs = 14 * 14 * 16 * 8 * 9
    W, I, O = (16 * 8 * 9 + 16) * 2, 8 * 196 * 2, 16 * 196 * 2
    unit = 0.85  # pJ of one 16-bit MAC; RF 1, array 2, buffer 6, DRAM 200 units per 16-bit access
    energy = (macs * unit + 4 * macs * unit + (W + I + O) * (6 + 2) * unit / 2 + W * 200 * unit / 2
              + 28e-3 * lat * 1e12)
    assert cost.latency_ms == pytest.approx(lat * 1e3)
    assert cost.energy_mj == pytest.approx(energy * 1e-9)
    # a 1x1 conv uses all 12 rows for channels: 32 x ceil(24/12) x 14 x 1 = 896 cycles
    assert eyeriss._layer_cost(conv(24, 32, 14, k=1, bits=16)).latency_ms == pytest.approx(896 / 200e6 * 1e3)
    assert eyeriss.describe()["peak_tops_by_bits"][16] == pytest.approx(2 * 168 * 200e6 / 1e12, abs=1e-3)


def test_weights_from_their_own_memory():
    """mcu-m7: a 1x1 conv 64 -> 64 on 8x8, int8, on the SMLAD pair (c = 2): weights stream from
    flash, activations stay in SRAM, nothing touches the external DRAM."""
    mcu = preset("mcu-m7")
    layer = conv(64, 64, 8, k=1)
    cost = mcu._layer_cost(layer)
    lat = 64 * 32 * 64 / 480e6   # 64 K x ceil(64/2) C x 64 positions, 1 per cycle
    W, I, O = 64 * 64 + 64, 4096, 4096
    energy = layer.macs * 0.85 + (W + I + O) * 12.5 + W * 16 + 0.3 * lat * 1e12
    assert cost.latency_ms == pytest.approx(lat * 1e3)
    assert cost.energy_mj == pytest.approx(energy * 1e-9)
    # a large fully-connected layer: the longer of its multiplies and its 4 MB flash read
    fc = LayerSpec("linear", 2048, 2048, (1, 1), (1, 1), w_bits=8, a_bits=8)
    assert mcu._layer_cost(fc).latency_ms == pytest.approx(max(2048 * 1024 / 480e6, fc.weight_bytes / 1.5e9) * 1e3)
    with pytest.raises(ValidationError, match="give both or neither"):
        device(weight_gb_s=1.0)


@pytest.mark.parametrize("path, value, named", [
    (("clock_ghz",), 1.0, "clock_ghz"),
    (("energy", "sram_pj_per_kb"), 1.0, "sram_pj_per_kb"),
    (("sources", "clock"), "a datasheet", "clock"),
])
def test_unknown_key_names_it(path, value, named):
    data = copy.deepcopy(SPEC)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValidationError) as err:
        AnalyticalAccelerator.from_dict(data)
    assert named in str(err.value)


def test_missing_key_and_mismatched_widths_are_refused():
    data = copy.deepcopy(SPEC)
    del data["dram_gb_s"]
    with pytest.raises(ValidationError, match="dram_gb_s"):
        AnalyticalAccelerator.from_dict(data)
    data = copy.deepcopy(SPEC)
    del data["energy"]["add_pj"][4]
    with pytest.raises(ValidationError, match="same bit widths"):
        AnalyticalAccelerator.from_dict(data)


def test_only_divisors_of_the_core_count_are_used():
    six = device(cores=6)
    maps = {c.mapping for c in six.alternatives(conv(64, 64, 32))}
    assert maps == {"1", "2xK", "2xOY", "3xK", "3xOY", "6xK", "6xOY"}


@pytest.mark.parametrize("path", [("clock_mhz",), ("macs_per_pe_cycle", 8), ("energy", "sram_pj_per_byte"),
                                  ("energy", "static_mw"), ("energy", "mult_pj", 8)])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_every_number_must_be_finite(path, value):
    data = copy.deepcopy(SPEC)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValidationError, match="finite number") as err:
        AnalyticalAccelerator.from_dict(data)
    assert err.value.errors()[0]["loc"] == path


def test_gpu_numbers_must_be_finite(root):
    from nasctl.hardware.gpu import GpuRoofline

    data = yaml.safe_load((root / "hardware" / "h100.yaml").read_text())
    data["hbm_gb_s"] = float("inf")
    with pytest.raises(ValidationError, match="hbm_gb_s"):
        GpuRoofline.from_dict(data)
