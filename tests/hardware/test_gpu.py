import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from nasctl.hardware.gpu import GpuRoofline
from nasctl.hardware.layers import LayerSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "hardware" / "h100.yaml").read_text())
PEAK16, HBM, LAUNCH = 989.4e12, 3350e9, 4e-6
WAVE = 2 * 128 * 128 * 8192 / (PEAK16 / 132)  # one wave of bf16 128x128 tiles over a reduction of 8192


def gpu(**changes) -> GpuRoofline:
    data = copy.deepcopy(SPEC)
    data.update(changes)
    return GpuRoofline.from_dict(data)


def gemm(m, n, k, bits=16):
    """A fully-connected layer as an M x K by K x N GEMM: M positions, K inputs, N outputs."""
    return LayerSpec("linear", k, n, (m, 1), (m, 1), w_bits=bits, a_bits=bits)


def test_split_k_below_one_wave():
    """A GEMM of 12 tiles shares each tile's reduction among 132 // 12 = 11 CTAs."""
    h100 = gpu()
    layer = gemm(512, 384, 8192)                                   # 4 x 3 tiles
    t_comp = 2 * 128 * 128 * 745 / (PEAK16 / 132)                  # ceil(8192 / 11) = 745
    bytes_ = (384 * 8192 + 384 + 512 * 8192 + 512 * 384) * 2
    assert h100._layer_cost(layer).latency_ms == pytest.approx((LAUNCH + max(t_comp, bytes_ / HBM)) * 1e3)


def test_hand_worked_gemm():
    """4096 x 1024 by 1024 x 1024 in bf16: 32 x 8 = 256 tiles of 128x128, 2 waves over 132 SMs."""
    layer = gemm(4096, 1024, 1024)
    cost = gpu()._layer_cost(layer)
    t_comp = 2 * 2 * 128 * 128 * 1024 / (PEAK16 / 132)             # 8.95 us
    bytes_ = (1024 * 1024 + 1024) * 2 + 4096 * 1024 * 2 * 2         # weights, input, output
    assert t_comp > bytes_ / HBM                                    # compute-bound (5.6 us of HBM)
    lat = LAUNCH + t_comp
    energy = 70 * lat + (700 - 70) * (2 * 4096 * 1024 * 1024 / PEAK16)
    assert cost.latency_ms == pytest.approx(lat * 1e3)
    assert cost.energy_mj == pytest.approx(energy * 1e3)
    assert "256 tiles in 2 waves" in cost.mapping and "compute-bound" in cost.mapping


@pytest.mark.parametrize("fewer, more", [
    ((1536, 1408), (896, 2432)),    # 12 x 11 = 132 tiles (1 wave) vs 7 x 19 = 133 tiles (2 waves)
    ((3072, 1408), (640, 6784)),    # 24 x 11 = 264 tiles (2 waves) vs 5 x 53 = 265 tiles (3 waves)
])
def test_one_more_tile_than_the_sms_costs_a_wave(fewer, more):
    h100 = gpu()
    a, b = (h100._layer_cost(gemm(m, n, 8192)) for m, n in (fewer, more))
    assert b.latency_ms - a.latency_ms == pytest.approx(WAVE * 1e3, rel=1e-9)


def test_latency_is_a_step_function_of_the_tiles():
    """fp32 output columns grown one tile at a time over 128 rows: flat within a wave, a step
    of one wave each time the tile count passes a multiple of 132."""
    h100 = gpu()
    lat = {t: h100._layer_cost(gemm(128, 128 * t, 4096, bits=32)).latency_ms for t in range(100, 400)}
    steps = [t for t in range(101, 400) if lat[t] > lat[t - 1] * (1 + 1e-9)]
    assert steps == [133, 265, 397]
    assert lat[264] == lat[133] and lat[132] == lat[100]


def test_small_batch_depthwise_conv_is_memory_bound():
    h100 = gpu()
    layer = LayerSpec("conv", 256, 256, (56, 56), (56, 56), (3, 3), 1, 256, 16, 16)
    cost = h100._layer_cost(layer)
    bytes_ = layer.weight_bytes + layer.in_bytes + layer.out_bytes
    assert cost.latency_ms == pytest.approx((LAUNCH + bytes_ / HBM) * 1e3)
    assert "CUDA cores" in cost.mapping and "memory-bound" in cost.mapping
    # far below the tensor-core peak: under 2% of it
    assert 2 * layer.macs / ((cost.latency_ms - LAUNCH * 1e3) * 1e-3) < 0.02 * PEAK16
    # a tiny layer costs about one kernel launch
    assert gpu()._layer_cost(gemm(1, 10, 128)).latency_ms == pytest.approx(LAUNCH * 1e3, rel=1e-2)


def test_widths():
    h100 = gpu()
    big = {b: h100._layer_cost(gemm(4096, 4096, 4096, b)) for b in (4, 8, 16, 32)}
    assert big[32].latency_ms > 10 * big[16].latency_ms           # fp32 off the tensor cores
    assert big[16].latency_ms > 1.8 * big[8].latency_ms           # fp8/int8 twice bf16
    assert big[4].latency_ms <= big[8].latency_ms                 # int4 runs at the int8 rate ...
    assert big[4].energy_mj <= big[8].energy_mj <= big[16].energy_mj <= big[32].energy_mj
    # ... with half the bytes, which a memory-bound layer feels
    small = {b: h100._layer_cost(gemm(16, 4096, 4096, b)) for b in (4, 8)}
    assert small[4].latency_ms < small[8].latency_ms
    assert h100._layer_cost(gemm(16, 16, 16, 64)) is None          # no 64-bit path


def test_vector_ops_and_matmul():
    h100 = gpu()
    add = LayerSpec("add", 64, 64, (56, 56), (56, 56), w_bits=16, a_bits=16)
    assert h100._layer_cost(add).latency_ms == pytest.approx((LAUNCH + 3 * 64 * 56 * 56 * 2 / HBM) * 1e3)
    # matmul reads its second operand (64 x 197) as an activation from HBM
    mm = LayerSpec("matmul", 64, 197, (197, 1), (197, 1), w_bits=16, a_bits=16)
    bytes_ = (197 * 64 + 64 * 197 + 197 * 197) * 2
    t_comp = 2 * 128 * 128 * 2 / (PEAK16 / 132)                    # 4 tiles, split-K 33: ceil(64/33)
    assert h100._layer_cost(mm).latency_ms == pytest.approx((LAUNCH + max(t_comp, bytes_ / HBM)) * 1e3)


@pytest.mark.parametrize("change, message", [
    ({"clock_ghz": 1.9}, "clock_ghz"),
    ({"vector_tflops": {8: 60, 16: 120, 32: 60}}, "same bit widths"),
    ({"idle_w": 800}, "must be below tdp_w"),
    ({"sources": {"sm_count": "a datasheet"}}, "sm_count"),
])
def test_bad_spec_is_refused_naming_the_problem(change, message):
    with pytest.raises(ValidationError, match=message):
        gpu(**change)


def test_describe():
    info = gpu().describe()
    assert info["sms"] == 132 and info["ridge_flops_per_byte"][16] == pytest.approx(295.3, abs=0.1)
