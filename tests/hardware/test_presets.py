"""Sanity of every built-in device preset: sourced, complete, and ordered as hardware is."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.hardware.layers import OPS, LayerSpec
from nasctl.hardware.loader import load_device
from nasctl.spaces.loader import load_space
from test_accelerator import _growth_pairs, conv, edp

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ["edge-quad", "edge-single", "eyeriss-like", "mcu-m7", "h100"]
NESTED = {"energy", "area", "co_search"}  # parameter groups whose entries are sourced one by one


def every_op(bits: int) -> list[LayerSpec]:
    """One layer of every op kind (and the sub-kinds priced differently), at `bits`."""
    def L(op, cin, cout, in_hw, out_hw, kernel=(1, 1), stride=1, groups=1, fn=""):
        return LayerSpec(op, cin, cout, in_hw, out_hw, kernel, stride, groups, bits, bits, fn=fn)
    return [
        L("conv", 32, 64, (28, 28), (28, 28), (3, 3), fn="relu"),
        L("conv", 64, 64, (28, 28), (14, 14), (3, 3), 2, 64),
        L("conv_transpose", 64, 32, (14, 14), (28, 28), (2, 2), 2),
        L("linear", 192, 768, (197, 1), (197, 1)),
        L("matmul", 64, 197, (197, 1), (197, 1)),
        L("pool", 64, 64, (28, 28), (14, 14), (2, 2), 2, fn="max"),
        L("pool", 64, 64, (14, 14), (1, 1), (14, 14), fn="avg"),
        L("add", 64, 64, (14, 14), (14, 14)),
        L("mul", 64, 64, (14, 14), (14, 14)),
        L("act", 768, 768, (197, 1), (197, 1), fn="gelu"),
        L("act", 64, 64, (14, 14), (14, 14), fn="relu"),
        L("softmax", 197, 197, (197, 1), (197, 1)),
        L("norm", 192, 192, (197, 1), (197, 1), fn="layer"),
        L("norm", 64, 64, (14, 14), (14, 14), fn="batch"),
        L("resize", 64, 64, (14, 14), (28, 28), fn="nearest"),
        L("resize", 64, 64, (14, 14), (28, 28), fn="linear"),
        L("concat", 128, 128, (14, 14), (14, 14)),
        L("split", 128, 128, (14, 14), (14, 14)),
        L("data", 192, 192, (197, 1), (197, 1), fn="transpose"),
    ]


@pytest.mark.parametrize("name", PRESETS)
def test_every_parameter_has_a_source(name):
    data = yaml.safe_load((ROOT / "hardware" / f"{name}.yaml").read_text())
    params = {k for k in data if k not in {"name", "kind", "description", "sources"} | NESTED}
    params |= {f"{group}.{k}" for group in NESTED & set(data) for k in data[group]}
    assert params == set(data["sources"]), sorted(params ^ set(data["sources"]))
    assert all(len(text.split()) >= 5 for text in data["sources"].values())
    assert load_device(name).describe()["sources"] == data["sources"]


@pytest.mark.parametrize("name", PRESETS)
def test_every_op_kind_priced_at_every_width(name):
    device = load_device(name)
    for bits in (4, 8, 16, 32):
        layers = every_op(bits)
        assert {layer.op for layer in layers} == OPS
        report = device.estimate(layers)
        assert not report.unsupported, (bits, report.unsupported)
        for layer, cost in zip(layers, report.costs):
            assert cost.latency_ms > 0 and cost.energy_mj > 0, (bits, layer, cost)


@pytest.mark.parametrize("name", PRESETS)
def test_whole_sampled_networks_are_priced(name):
    device, space = load_device(name), load_space("ee-mbv2")
    rng = np.random.default_rng(0)
    for _ in range(5):
        report = device.estimate(space.to_layers(space.sample(rng), (3, 32, 32), 10))
        assert not report.unsupported and report.latency_ms > 0 and report.energy_mj > 0


@pytest.mark.parametrize("name", PRESETS[1:])
def test_more_macs_never_cheaper_in_edp(name):
    device = load_device(name)
    for bits in (8, 32):
        for small, big in _growth_pairs(bits):
            assert edp(device._layer_cost(big)) >= edp(device._layer_cost(small)) * (1 - 1e-12), (small, big)
    # the other op kinds, grown along their positions and channels
    for small in every_op(8):
        for grown in (dict(in_hw=(small.in_hw[0] * 2, small.in_hw[1]), out_hw=(small.out_hw[0] * 2, small.out_hw[1])),
                      dict(in_ch=small.in_ch * 2, out_ch=small.out_ch * 2,
                           groups=small.groups * 2 if small.groups > 1 else 1)):
            big = LayerSpec(**{**{f: getattr(small, f) for f in ("op", "in_ch", "out_ch", "in_hw", "out_hw",
                                                                 "kernel", "stride", "groups", "w_bits", "a_bits",
                                                                 "fn")}, **grown})
            assert edp(device._layer_cost(big)) >= edp(device._layer_cost(small)) * (1 - 1e-12), (small, big)


@pytest.mark.parametrize("name", PRESETS[1:])
def test_fewer_bits_never_cost_more_energy(name):
    device = load_device(name)
    shapes = [(3, 16, 32, 3), (16, 48, 32, 1), (96, 576, 8, 1), (128, 128, 32, 3), (576, 96, 64, 1)]
    per_bits = {b: [conv(cin, cout, hw, k, bits=b, depthwise=dw) for cin, cout, hw, k in shapes
                    for dw in (False, True)] + every_op(b) for b in (4, 8, 16, 32)}
    for lower, higher in zip((4, 8, 16), (8, 16, 32)):
        for lo, hi in zip(per_bits[lower], per_bits[higher]):
            assert device._layer_cost(lo).energy_mj <= device._layer_cost(hi).energy_mj, (lo, hi)


@pytest.mark.parametrize("name", PRESETS)
def test_costs_are_cached_per_shape(name):
    device = load_device(name)
    for layer in every_op(8):
        twin = LayerSpec(**{**{f: getattr(layer, f) for f in layer.__dataclass_fields__}, "name": "twin", "segment": 3})
        assert device._layer_cost(layer) is device._layer_cost(twin)


LARGE_CONVS = [conv(128, 128, 32), conv(64, 64, 56), conv(256, 256, 14), conv(32, 32, 112), conv(512, 512, 7),
               conv(96, 96, 56, depthwise=True), conv(3, 32, 224, stride=2), conv(256, 1024, 14, k=1)]


def test_four_cores_never_slower_than_one_on_large_convs():
    quad, single = load_device("edge-quad"), load_device("edge-single")
    for layer in LARGE_CONVS:
        assert quad._layer_cost(layer).latency_ms <= single._layer_cost(layer).latency_ms, layer
    assert quad._layer_cost(LARGE_CONVS[0]).latency_ms < single._layer_cost(LARGE_CONVS[0]).latency_ms / 3


def test_the_mcu_is_far_slower_than_the_edge_tpu():
    mcu, tpu = load_device("mcu-m7"), load_device("edge-single")
    for layer in LARGE_CONVS + [conv(16, 16, 8, k=1), conv(24, 24, 16, depthwise=True)]:
        assert mcu._layer_cost(layer).latency_ms > 50 * tpu._layer_cost(layer).latency_ms, layer


@pytest.mark.parametrize("name", PRESETS)
def test_hw_show(name):
    result = CliRunner().invoke(app, ["hw", "show", name, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["name"] == name and shown["sources"]
    assert CliRunner().invoke(app, ["hw", "show", name]).exit_code == 0
