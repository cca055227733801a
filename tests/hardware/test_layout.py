"""Layout reorders: where onnxruntime moves tensors into and out of its blocked channel
layout (`nasctl.hardware.layout`), and their price on a profiled device (`lut.LayoutCost`)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.layout import BLOCKS, Reorder, machine_block
from nasctl.hardware.lut import LutDevice, LutSpec
from nasctl.hardware.measure.attribution import (MeasuredNetwork, attribute, in_context_costs, known_layout,
                                                 layout_block)
from nasctl.hardware.measure.context import NetBuilder
from nasctl.hardware.measure.profile import SEEDINGS, context_network, fit_layout_cost
from nasctl.hardware.onnx_import import import_onnx, runtime_reorders


def predicted(path: Path, block: int) -> Counter:
    return Counter(r.direction for r in import_onnx(path).layouts[block])


def channels_last_norm(b):
    """A ConvNeXt block's norm: to channels-last, a layer norm over channels, and back."""
    x = b.transpose(b.conv("input", 32, 3, groups=32), [0, 2, 3, 1])
    return b.conv(b.transpose(b.layer_norm(x), [0, 3, 1, 2]), 32, 1)


def _graphs():
    """Small graphs of the cases the rules tell apart: (name, input shape, build)."""
    def ghost(b):  # half the channels from a 1x1 conv, half from a depthwise conv of it: a concat of 12 + 12
        x = b.conv("input", 12, 1, act="relu")
        return b.conv(b.concat([x, b.conv(x, 12, 3, groups=12, act="relu")]), 32, 1)

    def squeeze_excite(b):  # a product broadcast over the map runs plain
        x = b.conv("input", 32, 1)
        return b.conv(b.mul(x, b.act(b.conv(b.global_pool(x), 32, 1), "sigmoid")), 32, 1)

    def two_uses(fn):  # an activation the conv before it cannot take in (its output read twice)
        return lambda b: (lambda x: b.conv(b.add(b.act(x, fn), x), 32, 1))(b.conv("input", 32, 1))

    return [
        ("ghost module", (1, 32, 16, 16), ghost),
        ("squeeze-excite", (1, 32, 16, 16), squeeze_excite),
        ("hardswish read twice", (1, 32, 16, 16), two_uses("hardswish")),
        ("sigmoid read twice", (1, 32, 16, 16), two_uses("sigmoid")),
        ("depthwise of 30 channels", (1, 32, 16, 16),
         lambda b: b.conv(b.conv(b.conv("input", 30, 1), 30, 3, groups=30), 32, 1)),
        ("depthwise of 28 channels", (1, 32, 16, 16),
         lambda b: b.conv(b.conv(b.conv("input", 28, 1), 28, 3, groups=28), 32, 1)),
        ("conv of 18 input channels", (1, 32, 16, 16), lambda b: b.conv(b.conv(b.conv("input", 18, 1), 18, 1), 32, 1)),
        ("conv of 10 input channels", (1, 32, 16, 16), lambda b: b.conv(b.conv("input", 10, 3), 32, 1)),
        ("max pool of 24 channels", (1, 32, 16, 16), lambda b: b.conv(b.pool(b.conv("input", 24, 1), "max"), 32, 1)),
        ("max pool of 32 channels", (1, 32, 16, 16), lambda b: b.conv(b.pool(b.conv("input", 32, 1), "max"), 32, 1)),
        ("global pool of a model input", (1, 32, 16, 16), lambda b: b.global_pool("input")),
        ("to channels-last", (1, 32, 16, 16), lambda b: b.transpose(b.conv("input", 32, 1), [0, 2, 3, 1])),
        ("stem of 3 channels", (1, 3, 32, 32), lambda b: b.conv(b.conv("input", 32, 3, stride=2), 48, 1)),
        ("channels-last layer norm", (1, 32, 16, 16), channels_last_norm),
    ]


@pytest.mark.parametrize("name, shape, build", _graphs(), ids=[g[0] for g in _graphs()])
def test_reorders_agree_with_onnxruntimes_own_graph(name, shape, build, tmp_path):
    block = machine_block()
    if block is None:
        pytest.skip("onnxruntime blocks channels only on x86 with AVX2 or AVX-512")
    b = NetBuilder(np.random.default_rng(0), shape)
    path = tmp_path / "model.onnx"
    onnx.save(b.model(build(b)), str(path))
    assert predicted(path, block) == Counter(runtime_reorders(path)), name


def test_reorders_of_profile_context_networks_agree_with_onnxruntime(tmp_path):
    block = machine_block()
    if block is None:
        pytest.skip("onnxruntime blocks channels only on x86 with AVX2 or AVX-512")
    seeding = SEEDINGS[-1]
    agree, reorders = 0, 0
    for index in range(24):  # every kind of context network: plain, int8, odd widths, strided, headed, ...
        model, _ = context_network(0, index, seeding)
        path = tmp_path / f"net{index}.onnx"
        onnx.save(model, str(path))
        runtime = Counter(runtime_reorders(path))
        agree += predicted(path, block) == runtime
        reorders += sum(runtime.values())
    assert reorders > 24  # the networks run reorders to predict
    assert agree == 24


def test_an_add_of_zero_runs_no_node_and_keeps_the_layout(tmp_path):
    """onnxruntime drops an add of a constant zero (MobileOne's unfused branches export one
    after each block): the conv's output stays blocked through it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random((32, 32, 1, 1), dtype=np.float32), name) for name in ("w1", "w2")]
    zero = numpy_helper.from_array(np.zeros((), dtype=np.float32), "zero")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]), helper.make_node("Add", ["c", "zero"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])],
                              [*weights, zero])
    path = tmp_path / "zero.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    for block in BLOCKS:  # the input in, the output out: nothing between the convs
        assert predicted(path, block) == {"in": 1, "out": 1}
    block = machine_block()
    if block is not None:
        assert predicted(path, block) == Counter(runtime_reorders(path))


def test_a_ghost_module_runs_reorders_only_where_its_concat_is_not_whole_blocks(tmp_path):
    """12 + 12 channels are whole blocks of neither width; 16 + 16 are of 8 and 16."""
    def ghost(half):
        b = NetBuilder(np.random.default_rng(0), (1, 32, 16, 16))
        x = b.conv("input", half, 1, act="relu")
        out = b.conv(b.concat([x, b.conv(x, half, 3, groups=half, act="relu")]), 32, 1)
        path = tmp_path / f"ghost{half}.onnx"
        onnx.save(b.model(out), str(path))
        return import_onnx(path).layouts

    for block in BLOCKS:
        # the model input in, the output out; the concat's inputs out and its output in again
        assert Counter(r.direction for r in ghost(12)[block]) == {"in": 2, "out": 3}
        assert Counter(r.direction for r in ghost(16)[block]) == {"in": 1, "out": 1}
    shapes = sorted(r.shape for r in ghost(12)[16] if r.direction == "out")
    assert shapes == [(1, 12, 16, 16), (1, 12, 16, 16), (1, 32, 16, 16)]


def test_transposes_folded_into_reorders_are_priced_as_the_reorders(tmp_path):
    """onnxruntime runs a transpose to channels-last after a blocked op as a reorder out of
    the blocked layout, and one back before a blocked conv as a reorder into it: the
    transposes' layers are then priced as those reorders, not as well as them."""
    b = NetBuilder(np.random.default_rng(0), (1, 32, 16, 16))
    path = tmp_path / "norm.onnx"
    onnx.save(b.model(channels_last_norm(b)), str(path))
    model = import_onnx(path)
    folded = [r for r in model.layouts[16] if r.replaces]
    assert sorted(r.kind for r in folded) == ["in", "out_last"]
    # (NCHW <-> NHWC: the innermost dim moves)
    assert {(model.layers[r.layer].op, model.layers[r.layer].fn) for r in folded} == {("data", "inner")}
    device = _device(LAYOUT)
    report = device.with_layout(device.estimate(model.layers), model.layouts)
    cost = device.spec.overhead.layout
    for r in folded:
        assert report.costs[r.layer].mapping == "layout reorder"
        assert report.costs[r.layer].latency_ms == pytest.approx(cost.ms(r.direction, r.elements))


def _device(layout: dict | None) -> LutDevice:
    overhead = {"per_model_ms": 0.0, **({"layout": layout} if layout else {})}
    rows = [{"op": "conv", "in_ch": 32, "out_ch": 32, "in_h": 8, "in_w": 8, "out_h": 8, "out_w": 8,
             "kernel_h": 1, "kernel_w": 1, "stride": 1, "groups": 1, "w_bits": 32, "a_bits": 32, "fn": "",
             "latency_ms": 0.01}]
    return LutDevice(LutSpec.model_validate({"name": "t", "kind": "lut", "overhead": overhead}), rows)


CONV = LayerSpec("conv", 32, 32, (8, 8), (8, 8), (1, 1), 1, 1)
LAYOUT = {"block": 16, "cut_elements": 4096, "reorder_in": [0.001, 1e-6, 2e-6], "reorder_out": [0.002, 1e-6, 3e-6]}


def test_a_profiled_device_prices_reorders_on_the_layers_they_are_charged_to():
    device = _device(LAYOUT)
    report = device.estimate([CONV, CONV])
    small, large = Reorder("in", "x", (1, 32, 8, 8), 0), Reorder("out", "y", (1, 32, 16, 16), 1)
    priced = device.with_layout(report, {16: [small, large], 8: []})
    # in: 0.001 + 2048 x 1e-6 (under the cut); out: 0.002 + 8192 x 3e-6 (from it)
    assert priced.costs[0].latency_ms - report.costs[0].latency_ms == pytest.approx(0.001 + 2048e-6)
    assert priced.costs[1].latency_ms - report.costs[1].latency_ms == pytest.approx(0.002 + 8192 * 3e-6)
    assert "layout reorders" in priced.costs[1].mapping
    # the reorders of another vector width, or none: the price as it was
    assert device.with_layout(report, {8: [small, large]}).latency_ms == report.latency_ms
    assert device.with_layout(report, {}).latency_ms == report.latency_ms
    # a device fitted without a layout cost shares the reorders among its kernels: nothing added
    plain = _device(None)
    assert plain.with_layout(plain.estimate([CONV]), {16: [small]}).latency_ms == plain.estimate([CONV]).latency_ms


def _network(i: int, reorders: list[Reorder], ms: dict[str, float], per_node: float = 0.001) -> MeasuredNetwork:
    """A network of two kernels with `reorders` profiled at `ms` per direction (spread evenly)."""
    layers = [LayerSpec("conv", 32, 32, (8, 8), (8, 8), (1, 1), 1, 1, name="k0:conv_0"),
              LayerSpec("conv", 32, 32, (8, 8), (8, 8), (1, 1), 1, 1, name="k1:conv_1")]
    nodes = [("k0:conv_0", 0.02 + per_node)]
    for r in reorders:
        share = ms[r.direction] / sum(1 for q in reorders if q.direction == r.direction)
        nodes.append(("ReorderInput" if r.direction == "in" else f"ReorderOutput_token_{i}", share + per_node))
    nodes.append(("k1:conv_1", 0.03 + per_node))
    latency = 0.005 + 0.05 + sum(ms.values())
    return MeasuredNetwork(f"n{i}", layers, *attribute(nodes, layers), latency, nodes=nodes,
                           layouts={16: reorders, 8: []})


def test_the_layout_cost_is_fitted_to_the_profiled_reorders():
    rng = np.random.default_rng(0)
    fixed, small, large, cut = 0.0005, 1e-7, 3e-7, 65536
    networks = []
    for i in range(40):
        reorders = [Reorder(d, "", (1, int(c), int(s), int(s)), 0) for d, c, s in
                    zip(rng.choice(["in", "out"], 3), rng.integers(8, 64, 3), rng.choice([8, 32, 64, 96], 3))]
        ms = {d: sum(fixed + r.elements * (small if r.elements < cut else large) for r in reorders if r.direction == d)
              for d in ("in", "out")}
        networks.append(_network(i, reorders, ms))
    block, agree = layout_block(networks)
    assert block == 16 and agree[8] == 0  # the width whose reorders the profiles ran
    cost, how = fit_layout_cost(networks, 0.001, block, agree)
    assert cost["block"] == 16 and cost["cut_elements"] == cut
    for direction in ("reorder_in", "reorder_out"):
        assert cost[direction] == pytest.approx([fixed, small, large], rel=0.02)
    assert how["median_error_pct"] < 1
    # too few networks with reorders: not fitted, and said so
    cost, how = fit_layout_cost(networks[:10], 0.001, block, agree)
    assert cost is None and "not fitted" in how["note"]


def test_known_reorders_are_taken_off_their_networks_kernels():
    reorders = [Reorder("out", "", (1, 32, 8, 8), 1)]
    network = _network(0, reorders, {"in": 0.0, "out": 0.02})
    assert known_layout(network, 16) == reorders
    assert known_layout(network, 8) == []  # predicted none for 8, the profile ran one: not known
    priced, _ = in_context_costs([network], known=(0.005, 0.001), block=16)
    assert priced[0].sum() == pytest.approx(network.latency_ms - 0.005 - 0.02)
    shared, _ = in_context_costs([network], known=(0.005, 0.001), block=None)
    assert shared[0].sum() == pytest.approx(network.latency_ms - 0.005)
