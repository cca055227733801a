"""`hw validate --by-kernel`: any ONNX model's profiled node times attributed to the layers
the importer reads from it, and set beside a device's prices of them."""

import numpy as np
import onnx
import pytest

from nasctl.hardware.measure.attribution import tagged_by_kernel
from nasctl.hardware.measure.context import quantize_int8
from nasctl.hardware.measure.runner import NODE, TAG, make_session, random_feed
from nasctl.hardware.onnx_import import import_onnx


def exported(tmp_path, name="net"):
    """A small network as torch's exporter writes it (its own node and tensor names):
    conv-bn-relu, a squeeze-excite, a residual sum, a classifier."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                            torch.nn.ReLU())
            self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.se = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(16, 8, 1), torch.nn.ReLU(),
                                          torch.nn.Conv2d(8, 16, 1), torch.nn.Sigmoid())
            self.head = torch.nn.Linear(16, 10)

        def forward(self, x):
            x = self.stem(x)
            y = self.conv(x)
            x = x + y * self.se(y)
            return self.head(x.mean((2, 3)))

    torch.manual_seed(0)
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(Net().eval(), torch.randn(1, 3, 16, 16), str(path), opset_version=17, dynamo=False)
    return path


def outputs(model, seed=0):
    session = make_session(model.SerializeToString(), 1)
    return session.run(None, random_feed(session, np.random.default_rng(seed)))


def same_layers(a, b):
    key = lambda layer: (layer.op, layer.fn, layer.shape_key(), layer.w_bits, layer.a_bits)  # noqa: E731
    return [key(x) for x in a] == [key(x) for x in b]


def test_a_tagged_model_computes_the_same_and_reads_as_the_same_layers(tmp_path):
    path = exported(tmp_path)
    model = onnx.load(str(path))
    tagged = tagged_by_kernel(model)
    assert all(TAG.match(n.name) and NODE.match(n.name) for n in tagged.graph.node)
    assert [n.name for n in model.graph.node] != [n.name for n in tagged.graph.node]  # the original is untouched
    for a, b in zip(outputs(model), outputs(tagged)):
        np.testing.assert_array_equal(a, b)
    again = tmp_path / "tagged.onnx"
    again.write_bytes(tagged.SerializeToString())
    assert same_layers(import_onnx(path).layers, import_onnx(again).layers)
    # int8: a QDQ group is one kernel - each DequantizeLinear tagged as the node it feeds,
    # each QuantizeLinear as the node whose output it quantizes
    int8 = tmp_path / "int8.onnx"
    feeds = [{"input.1": np.random.default_rng(k).standard_normal((1, 3, 16, 16)).astype(np.float32)} for k in range(2)]
    assert model.graph.input[0].name == "input.1"
    quantize_int8(path, int8, feeds, per_channel=True)
    q = tagged_by_kernel(onnx.load(str(int8)))
    tag = {o: TAG.match(n.name).group(1) for n in q.graph.node for o in n.output}
    readers = {}
    for n in q.graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    quantized = [n for n in q.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert quantized
    for n in quantized:
        mine = TAG.match(n.name).group(1)
        if n.op_type == "QuantizeLinear" and n.input[0] in tag:
            assert mine == tag[n.input[0]], n.name
        elif n.op_type == "DequantizeLinear" and n.output[0] in readers:
            assert mine == TAG.match(readers[n.output[0]][0].name).group(1), n.name
        elif n.op_type == "DequantizeLinear":  # dequantizes the model's output: its Q's kernel
            assert mine == tag[n.input[0]], n.name
    again.write_bytes(q.SerializeToString())
    assert same_layers(import_onnx(int8).layers, import_onnx(again).layers)
    assert any(layer.w_bits == 8 for layer in import_onnx(again).layers)


def test_a_model_with_subgraphs_is_refused():
    from onnx import TensorProto, helper

    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "b", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    with pytest.raises(ValueError, match="subgraphs"):
        tagged_by_kernel(helper.make_model(graph))


def test_breakdown_gives_every_layer_its_price_and_in_context_time(tmp_path):
    from nasctl.hardware.measure.profile import kernel_breakdown
    from nasctl.hardware.measure.runner import Protocol
    from nasctl.hardware.loader import load_device

    paths = [exported(tmp_path, "a"), exported(tmp_path, "b")]
    device = load_device("edge-single")  # any device that prices these layers
    doc = kernel_breakdown(device, paths, Protocol(rounds=3, repeats=2, warmup=1, sessions=1), worst=5)
    layers = [import_onnx(p).layers for p in paths]
    assert sum(r["layers"] for r in doc["kernels"]) == sum(map(len, layers))
    priced = sum(device.estimate(ls).latency_ms for ls in layers)
    assert sum(r["predicted_ms"] for r in doc["kernels"]) == pytest.approx(priced, rel=1e-6)
    # what the layers took in context adds up to each model's end-to-end time, less the run overhead
    measured = sum(r["measured_ms"] for r in doc["kernels"])
    assert measured + 2 * doc["run_overhead_ms"] == pytest.approx(sum(doc["end_to_end_ms"]), rel=0.01)
    assert all(ms > 0 for ms in doc["end_to_end_ms"]) and doc["models"] == ["a", "b"]
    worst = [abs(r["predicted_ms"] - r["measured_ms"]) for r in doc["worst_layers"]]
    assert len(worst) == 5 and worst == sorted(worst, reverse=True)
    diffs = [abs(r["predicted_ms"] - r["measured_ms"]) for r in doc["kernels"]]
    assert diffs == sorted(diffs, reverse=True)
