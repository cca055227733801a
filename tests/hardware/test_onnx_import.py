"""ONNX import: each handler family on hand-built graphs, against figures worked out by hand."""

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from nasctl.errors import UsageError
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.onnx_import import HANDLERS, import_onnx
from tests.cli.cli_helpers import onnx_model

RNG = np.random.default_rng(0)


def weight(name, *shape, dtype=np.float32):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 10).astype(dtype), name)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def save(path, nodes, inputs, outputs, inits=(), opset=17):
    """A model of `nodes`; `inputs` maps names to shapes (float) or (shape, elem type)."""
    def info(name, spec):
        shape, elem = spec if isinstance(spec, tuple) and isinstance(spec[0], (list, tuple)) else (spec, T.FLOAT)
        return helper.make_tensor_value_info(name, elem, shape)

    graph = helper.make_graph(nodes, "g", [info(n, s) for n, s in inputs.items()],
                              [helper.make_empty_tensor_value_info(o) for o in outputs], list(inits))
    onnx.save(onnx_model(graph, opset), path)
    return path


def layers_of(tmp_path, nodes, inputs, outputs, inits=(), opset=17, **kw):
    result = import_onnx(save(tmp_path / "m.onnx", nodes, inputs, outputs, inits, opset), **kw)
    assert not result.unsupported, result.unsupported
    return result.layers


def only(layers) -> LayerSpec:
    assert len(layers) == 1, layers
    return layers[0]


# --- convolutions and matrix products -----------------------------------------------

@pytest.mark.parametrize("group, w_shape, macs", [
    (1, (16, 8, 3, 3), 16 * 16 * 16 * 8 * 9),   # plain: out positions x K x C x taps
    (4, (16, 2, 3, 3), 16 * 16 * 16 * 2 * 9),   # grouped: C/g inputs per output
    (8, (8, 1, 3, 3), 16 * 16 * 8 * 1 * 9),     # depthwise
])
def test_conv(tmp_path, group, w_shape, macs):
    layer = only(layers_of(tmp_path, [node("Conv", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                           group=group)],
                           {"x": [1, 8, 32, 32]}, ["y"], [weight("w", *w_shape), weight("b", w_shape[0])]))
    assert (layer.op, layer.in_ch, layer.out_ch) == ("conv", 8, w_shape[0])
    assert (layer.in_hw, layer.out_hw) == ((32, 32), (16, 16))
    assert (layer.kernel, layer.stride, layer.groups, layer.w_bits, layer.a_bits) == ((3, 3), 2, group, 32, 32)
    assert layer.macs == macs
    assert layer.params == w_shape[0] * w_shape[1] * 9 + w_shape[0]


def test_conv1d_is_channels_by_length(tmp_path):
    layer = only(layers_of(tmp_path, [node("Conv", ["x", "w"], ["y"], pads=[2, 2])],
                           {"x": [1, 4, 50]}, ["y"], [weight("w", 6, 4, 5)]))
    assert (layer.in_ch, layer.out_ch, layer.out_hw, layer.kernel) == (4, 6, (50, 1), (5, 1))
    assert layer.macs == 50 * 6 * 4 * 5


def test_conv_transpose(tmp_path):
    layer = only(layers_of(tmp_path, [node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])],
                           {"x": [1, 8, 4, 4]}, ["y"], [weight("w", 8, 4, 2, 2)]))
    assert (layer.op, layer.in_ch, layer.out_ch, layer.in_hw, layer.out_hw) == ("conv_transpose", 8, 4, (4, 4), (8, 8))
    assert layer.macs == 4 * 4 * 8 * 4 * 2 * 2  # every input position scatters into k x k outputs


def test_gemm_is_linear_with_bias_in_params(tmp_path):
    layer = only(layers_of(tmp_path, [node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                           {"x": [1, 64]}, ["y"], [weight("w", 10, 64), weight("b", 10)]))
    assert (layer.op, layer.in_ch, layer.out_ch, layer.out_hw) == ("linear", 64, 10, (1, 1))
    assert (layer.macs, layer.params) == (640, 650)


def test_matmul_with_weight_is_linear_per_token_and_bias_add_is_folded(tmp_path):
    layer = only(layers_of(tmp_path, [node("MatMul", ["x", "w"], ["h"]), node("Add", ["b", "h"], ["y"])],
                           {"x": [1, 5, 16]}, ["y"], [weight("w", 16, 32), weight("b", 32)]))
    assert (layer.op, layer.in_ch, layer.out_ch, layer.in_hw, layer.out_hw) == ("linear", 16, 32, (5, 1), (5, 1))
    assert layer.macs == 5 * 16 * 32


def test_matmul_between_activations(tmp_path):
    # attention scores: 2 heads, 5 tokens, 8 dims per head
    layer = only(layers_of(tmp_path, [node("MatMul", ["q", "k"], ["s"])],
                           {"q": [1, 2, 5, 8], "k": [1, 2, 8, 5]}, ["s"]))
    assert (layer.op, layer.in_ch, layer.out_ch, layer.out_hw) == ("matmul", 8, 5, (5, 2))
    assert (layer.macs, layer.params) == (2 * 5 * 5 * 8, 0)


@pytest.mark.parametrize("nodes, inits, folded", [
    # attention scores scaled after the product, or a query scaled before it: onnxruntime
    # folds the scalar into the product (FusedMatMul's alpha)
    ([node("MatMul", ["q", "k"], ["s"]), node("Mul", ["s", "c"], ["y"])], [const("c", 0.125)], True),
    ([node("MatMul", ["q", "k"], ["s"]), node("Div", ["s", "c"], ["y"])], [const("c", 8.0)], True),
    ([node("Mul", ["q", "c"], ["qs"]), node("MatMul", ["qs", "k"], ["y"])], [const("c", 0.125)], True),
    # not a scalar, or dividing the scalar by the scores: an element-wise op of its own
    ([node("MatMul", ["q", "k"], ["s"]), node("Mul", ["s", "c"], ["y"])], [const("c", np.ones(5) * 0.1)], False),
    ([node("MatMul", ["q", "k"], ["s"]), node("Div", ["c", "s"], ["y"])], [const("c", 8.0)], False),
])
def test_a_scalar_scaling_a_product_of_activations_is_folded_as_onnxruntime_fuses_it(tmp_path, nodes, inits, folded):
    import onnxruntime as ort

    inputs = {"q": [1, 2, 5, 8], "k": [1, 2, 8, 5]}
    layers = layers_of(tmp_path, nodes, inputs, ["y"], inits)
    assert [l.op for l in layers] == (["matmul"] if folded else ["matmul", "mul"])
    model = onnx.load(str(tmp_path / "m.onnx"))
    model.ir_version = 8  # what opset 17 needs: every supported onnxruntime loads it
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert ("FusedMatMul" in ran and not {"Mul", "Div"} & set(ran)) == folded, ran


@pytest.mark.parametrize("nodes, inits, params", [
    # the 216 weights of a conv 3->8 (3x3) without bias, not 224
    ([node("Conv", ["x", "w"], ["y"])], [weight("w", 8, 3, 3, 3)], 216),
    ([node("Conv", ["x", "w", "b"], ["y"])], [weight("w", 8, 3, 3, 3), weight("b", 8)], 224),
    # a conv's batch norm and a constant Add fold into it as its bias
    ([node("Conv", ["x", "w"], ["c"]), node("Add", ["c", "b"], ["y"])], [weight("w", 8, 3, 3, 3), weight("b", 8, 1, 1)],
     224),
    ([node("ConvTranspose", ["x", "w"], ["y"])], [weight("w", 3, 8, 2, 2)], 96),
    ([node("ConvTranspose", ["x", "w", "b"], ["y"])], [weight("w", 3, 8, 2, 2), weight("b", 8)], 104),
    # Gemm: C is a bias when it is a constant
    ([node("Flatten", ["x"], ["f"]), node("Gemm", ["f", "w"], ["y"], transB=1)], [weight("w", 10, 192)], 1920),
    ([node("Flatten", ["x"], ["f"]), node("Gemm", ["f", "w", "b"], ["y"], transB=1)],
     [weight("w", 10, 192), weight("b", 10)], 1930),
    # MatMul has none, unless a constant Add after it is folded in
    ([node("Flatten", ["x"], ["f"]), node("MatMul", ["f", "w"], ["y"])], [weight("w", 192, 10)], 1920),
    ([node("Flatten", ["x"], ["f"]), node("MatMul", ["f", "w"], ["m"]), node("Add", ["m", "b"], ["y"])],
     [weight("w", 192, 10), weight("b", 10)], 1930),
])
def test_params_count_a_bias_only_where_the_graph_has_one(tmp_path, nodes, inits, params):
    layer = only(layers_of(tmp_path, nodes, {"x": [1, 3, 8, 8]}, ["y"], inits))
    assert layer.params == params
    assert layer.weight_bytes == params * 4


def test_gemm_adding_an_activation_counts_no_bias(tmp_path):
    layers = layers_of(tmp_path, [node("Gemm", ["x", "w", "r"], ["y"], transB=1)], {"x": [1, 16], "r": [1, 4]}, ["y"],
                       [weight("w", 4, 16)])
    assert only(layers).params == 64


def test_integer_conv_reads_no_zero_point_as_a_bias(tmp_path):
    q = [numpy_helper.from_array(np.array(0, np.uint8), "zu"), numpy_helper.from_array(np.array(0, np.int8), "zi")]
    layer = only(layers_of(tmp_path, [node("ConvInteger", ["x", "w", "zu", "zi"], ["y"])],
                           {"x": ([1, 4, 6, 6], T.UINT8)}, ["y"], [weight("w", 2, 4, 1, 1, dtype=np.int8), *q]))
    assert layer.params == 8


def test_params_of_a_torch_export_match_the_torch_model(tmp_path):
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(),              # no bias
                          nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),                 # bias
                          nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),     # BN folded: bias
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 12, bias=False), nn.ReLU(),
                          nn.Linear(12, 10)).eval()
    path = tmp_path / "m.onnx"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, 3, 8, 8),), str(path), dynamo=False, opset_version=17)
    layers = [l for l in import_onnx(path).layers if l.op in ("conv", "linear")]
    torch_params = sum(p.numel() for p in model.parameters())
    bn = model[5]
    # the deployed model: batch norm folded into the conv before it (one bias per channel)
    assert sum(l.params for l in layers) == torch_params - 2 * bn.num_features + bn.num_features
    assert [l.bias for l in layers] == [False, True, True, False, True]


# --- fusion --------------------------------------------------------------------------

def _bn(name, x, y, ch):
    inits = [const(f"{name}.{p}", np.ones(ch)) for p in ("scale", "bias", "mean", "var")]
    return node("BatchNormalization", [x, *(i.name for i in inits)], [y]), inits


def test_batch_norm_and_activation_fold_into_the_conv(tmp_path):
    bn, inits = _bn("bn", "c", "n", 8)
    layer = only(layers_of(tmp_path, [node("Conv", ["x", "w"], ["c"]), bn, node("Relu", ["n"], ["y"])],
                           {"x": [1, 3, 8, 8]}, ["y"], [weight("w", 8, 3, 1, 1), *inits]))
    assert (layer.op, layer.fn, layer.params) == ("conv", "relu", 8 * 3 + 8)


def test_batch_norm_alone_or_after_an_activation_is_a_norm_layer(tmp_path):
    bn1, i1 = _bn("bn1", "x", "a", 3)
    bn2, i2 = _bn("bn2", "r", "y", 8)
    layers = layers_of(tmp_path, [bn1, node("Conv", ["a", "w"], ["c"]), node("Relu", ["c"], ["r"]), bn2],
                       {"x": [1, 3, 8, 8]}, ["y"], [weight("w", 8, 3, 1, 1), *i1, *i2])
    assert [(l.op, l.fn, l.in_ch) for l in layers] == [("norm", "batch", 3), ("conv", "relu", 3), ("norm", "batch", 8)]


@pytest.mark.parametrize("op, fn, opset", [
    ("Relu", "relu", 17), ("Clip", "clip", 17), ("HardSwish", "hardswish", 17), ("HardSigmoid", "hardsigmoid", 17),
    ("Sigmoid", "sigmoid", 17), ("Tanh", "tanh", 17), ("Gelu", "gelu", 20), ("LeakyRelu", "leakyrelu", 17),
])
def test_activation_fuses_into_conv_and_linear_else_stands_alone(tmp_path, op, fn, opset):
    nodes = [node("Conv", ["x", "w"], ["c"]), node(op, ["c"], ["a"]),           # fused
             node("Add", ["x", "a"], ["s"]), node(op, ["s"], ["t"]),            # after an add: its own layer
             node("Flatten", ["t"], ["f"]), node("Gemm", ["f", "fw"], ["g"], transB=1), node(op, ["g"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 2, 2]}, ["y"], [weight("w", 4, 4, 1, 1), weight("fw", 3, 16)],
                       opset=opset)
    assert [(l.op, l.fn) for l in layers] == [("conv", fn), ("add", ""), ("act", fn), ("linear", fn)]
    assert (layers[2].in_ch, layers[2].in_hw) == (4, (2, 2))


def test_activation_is_not_fused_when_the_conv_output_is_used_elsewhere(tmp_path):
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]), node("Add", ["c", "r"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 2, 2]}, ["y"], [weight("w", 4, 4, 1, 1)])
    assert [(l.op, l.fn) for l in layers] == [("conv", ""), ("act", "relu"), ("add", "")]


def _residual_block(conv_act: str, other: str, also_read: bool = False, relu_after: bool = False):
    """x -> 1x1 conv + relu -> p; 3x3 conv of p (+ relu, or + relu and a batch norm) -> c;
    Add(c, other) (+ relu)."""
    nodes = [node("Conv", ["x", "w0"], ["p0"]), node("Relu", ["p0"], ["p"]),
             node("Conv", ["p", "w1", "b1"], ["c0"], pads=[1, 1, 1, 1])]
    if conv_act == "relu, bn":
        nodes += [node("Relu", ["c0"], ["c1"]), _bn("bn", "c1", "c", 32)[0]]
    else:
        nodes.append(node("Relu", ["c0"], ["c"]) if conv_act else node("Identity", ["c0"], ["c"]))
    if other == "se":  # the block input scaled by a squeeze-excite gate: a broadcast product
        nodes += [node("GlobalAveragePool", ["p"], ["g0"]), node("Conv", ["g0", "wse"], ["g1"]),
                  node("Sigmoid", ["g1"], ["g2"]), node("Mul", ["p", "g2"], ["se"])]
    nodes.append(node("Add", ["c", other], ["s"]))
    outputs = ["s"]
    if relu_after:
        nodes.append(node("Relu", ["s"], ["y"]))
        outputs = ["y"]
    if also_read:
        nodes.append(node("Sigmoid", ["c"], ["g"]))
        outputs.append("g")
    inits = [weight("w0", 32, 32, 1, 1), weight("w1", 32, 32, 3, 3), weight("b1", 32), weight("bias", 32, 1, 1),
             weight("wse", 32, 32, 1, 1),
             *(_bn("bn", "c1", "c", 32)[1] if conv_act == "relu, bn" else [])]
    return nodes, outputs, inits


@pytest.mark.parametrize("conv_act, other, also_read, relu_after, fn", [
    ("", "p", False, False, "sum"),          # a residual block's projection: accumulated into the conv
    ("", "p", False, True, "sum"),           # ... with the activation after the sum (fused too)
    ("relu, bn", "p", False, False, "sum"),  # a batch norm after the activation: run as a conv
    ("relu", "p", False, False, ""),         # the conv has an activation: the add runs after it
    ("", "x", False, False, ""),             # the other operand is the model's input, not in the conv's layout
    ("", "se", False, False, ""),            # ... or a broadcast product (a squeeze-excite scale)
    ("", "p", True, False, ""),              # the conv's output is read elsewhere too
    ("", "bias", False, False, ""),          # a broadcast constant: a bias, not a residual
])
def test_a_residual_sum_is_told_apart_as_onnxruntime_fuses_it(tmp_path, conv_act, other, also_read, relu_after,
                                                              fn):
    """An Add onnxruntime accumulates into the conv before it (no node of its own in the
    graph it runs) is an add with fn "sum"; any other stays a stand-alone add."""
    import onnxruntime as ort

    nodes, outputs, inits = _residual_block(conv_act, other, also_read, relu_after)
    path = save(tmp_path / "m.onnx", nodes, {"x": [1, 32, 8, 8]}, outputs, inits)
    adds = [l for l in import_onnx(path).layers if l.op == "add"]
    if other == "bias":
        assert adds == []  # folded into the conv as its bias
        return
    assert [l.fn for l in adds] == [fn]
    ran = optimized_ops(path, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert ("Add" in ran) == (fn != "sum"), ran


def optimized_ops(path, tmp_path, level) -> set:
    """The op types of the graph onnxruntime optimizes the model at `path` into."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return {n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node}


@pytest.mark.parametrize("shape, other, read_elsewhere, fn", [
    ([1, 16, 32], [1, 16, 32], False, "skip"),  # a token sum only a layer norm reads: one fused kernel
    ([1, 16, 32], [1, 16, 32], True, ""),       # the sum is read elsewhere too (a residual stream)
    ([1, 4, 4, 32], [1, 4, 4, 32], False, ""),  # not tokens: channels-last maps
    ([1, 16, 32], [1, 1, 32], False, ""),       # a broadcast operand
])
def test_an_add_fused_into_the_layer_norm_after_it_is_told_apart(tmp_path, shape, other, read_elsewhere, fn):
    """An Add onnxruntime fuses with the LayerNormalization reading it (one
    SkipLayerNormalization in the graph it runs) is an add with fn "skip"; any other
    stays a stand-alone add, as onnxruntime runs it."""
    import onnxruntime as ort

    c = shape[-1]
    nodes = [node("Add", ["a", "b"], ["s"]), node("LayerNormalization", ["s", "g", "be"], ["y"], axis=-1)]
    outputs = ["y"]
    if read_elsewhere:
        nodes.append(node("Relu", ["s"], ["r"]))
        outputs.append("r")
    path = save(tmp_path / "m.onnx", nodes, {"a": shape, "b": other}, outputs,
                [const("g", np.ones(c)), const("be", np.zeros(c))])
    adds = [l for l in import_onnx(path).layers if l.op == "add"]
    assert [l.fn for l in adds] == [fn]
    ran = optimized_ops(path, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    assert ("SkipLayerNormalization" in ran) == (fn == "skip"), ran


def test_element_wise_math_is_a_stand_alone_activation(tmp_path):
    nodes = [node("Conv", ["x", "w"], ["c"]), node("PRelu", ["c", "slope"], ["p"]), node("Exp", ["p"], ["e"]),
             node("Pow", ["e", "two"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 2, 2]}, ["y"],
                       [weight("w", 4, 4, 1, 1), weight("slope", 4, 1, 1), const("two", 2.0)])
    assert [(l.op, l.fn) for l in layers] == [("conv", "prelu"), ("act", "exp"), ("act", "pow")]


def _erf_gelu(x, y, half_first=False):
    """GELU as torch exports it before opset 20 (in both orders of the two products)."""
    inits = [const(f"{y}.sqrt2", 1.4142135), const(f"{y}.one", 1.0), const(f"{y}.half", 0.5)]
    nodes = [node("Div", [x, f"{y}.sqrt2"], [f"{y}.d"]), node("Erf", [f"{y}.d"], [f"{y}.e"]),
             node("Add", [f"{y}.e", f"{y}.one"], [f"{y}.a"])]
    if half_first:
        nodes += [node("Mul", [x, f"{y}.half"], [f"{y}.h"]), node("Mul", [f"{y}.h", f"{y}.a"], [y])]
    else:
        nodes += [node("Mul", [x, f"{y}.a"], [f"{y}.m"]), node("Mul", [f"{y}.m", f"{y}.half"], [y])]
    return nodes, inits


@pytest.mark.parametrize("half_first", [False, True])
def test_erf_gelu_is_recognised(tmp_path, half_first):
    g1, i1 = _erf_gelu("h", "g", half_first)
    g2, i2 = _erf_gelu("s", "y", half_first)
    nodes = [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["h"]), *g1,   # linear + bias + GELU
             node("Add", ["g", "x2"], ["s"]), *g2]                                    # a GELU of its own
    layers = layers_of(tmp_path, nodes, {"x": [1, 5, 16], "x2": [1, 5, 32]}, ["y"],
                       [weight("w", 16, 32), weight("b", 32), *i1, *i2])
    assert [(l.op, l.fn) for l in layers] == [("linear", "gelu"), ("add", ""), ("act", "gelu")]
    assert (layers[2].in_ch, layers[2].in_hw) == (32, (5, 1))


def test_decomposed_hardswish_and_swish_fuse(tmp_path):
    nodes = [node("Conv", ["x", "w"], ["c"]), node("HardSigmoid", ["c"], ["hs"]), node("Mul", ["c", "hs"], ["a"]),
             node("Conv", ["a", "w"], ["c2"]), node("Add", ["c2", "three"], ["p"]),
             node("Clip", ["p", "zero", "six"], ["q"]), node("Div", ["q", "six"], ["r"]),
             node("Mul", ["c2", "r"], ["b"]),
             node("Conv", ["b", "w"], ["c3"]), node("Sigmoid", ["c3"], ["s"]), node("Mul", ["c3", "s"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 2, 2]}, ["y"],
                       [weight("w", 4, 4, 1, 1), const("three", 3.0), const("zero", 0.0), const("six", 6.0)])
    assert [(l.op, l.fn) for l in layers] == [("conv", "hardswish"), ("conv", "hardswish"), ("conv", "swish")]


def test_sigmoid_gate_of_another_tensor_is_not_swish(tmp_path):
    # squeeze-excite: x * sigmoid(pool(x)) is a gate, not an activation of x
    nodes = [node("GlobalAveragePool", ["x"], ["p"]), node("Sigmoid", ["p"], ["s"]), node("Mul", ["x", "s"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 6, 6]}, ["y"])
    assert [(l.op, l.fn) for l in layers] == [("pool", "avg"), ("act", "sigmoid"), ("mul", "")]
    assert (layers[2].out_ch, layers[2].out_hw) == (4, (6, 6))


@pytest.mark.parametrize("affine", [False, True])
def test_decomposed_layer_norm_is_one_norm_layer(tmp_path, affine):
    nodes = [node("ReduceMean", ["x"], ["mu"], axes=[-1]), node("Sub", ["x", "mu"], ["d"]),
             node("Pow", ["d", "two"], ["sq"]), node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]), node("Div", ["d", "sd"], ["n"])]
    inits = [const("two", 2.0), const("eps", 1e-5)]
    if affine:
        nodes += [node("Mul", ["n", "gamma"], ["ng"]), node("Add", ["ng", "beta"], ["y"])]
        inits += [weight("gamma", 16), weight("beta", 16)]
    else:
        nodes[-1].output[0] = "y"
    layer = only(layers_of(tmp_path, nodes, {"x": [1, 5, 16]}, ["y"], inits))
    assert (layer.op, layer.fn, layer.in_ch, layer.in_hw, layer.out_elems) == ("norm", "layer", 16, (5, 1), 80)


@pytest.mark.parametrize("shape, axis, opset, fused", [
    ([1, 5, 16], -1, 17, True),         # tokens: the innermost axis
    ([1, 6, 6, 16], 3, 17, True),       # channels last (ConvNeXt's norm after its permute)
    ([1, 16, 6, 6], 1, 17, False),      # channels first (ConvNeXt's and EdgeNeXt's LayerNorm2d spelled out)
    ([1, 16, 6, 6], 1, 18, False),      # axes as an input, as opset 18 writes them
])
def test_a_layer_norm_spelled_out_over_another_axis_than_the_innermost_runs_op_by_op(tmp_path, shape, axis, opset,
                                                                                    fused):
    """onnxruntime fuses a spelled-out layer norm into one LayerNormalization only where it
    reduces the innermost axis; over the channels of an NCHW tensor it runs its nine ops,
    each a pass over the tensor: another kernel (fn `LAYER_OPS`), checked against the
    optimized graph."""
    ort = pytest.importorskip("onnxruntime")
    c = shape[axis]

    def mean(x, y):
        if opset >= 18:
            return node("ReduceMean", [x, "axes"], [y])
        return node("ReduceMean", [x], [y], axes=[axis])

    nodes = [mean("x", "mu"), node("Sub", ["x", "mu"], ["d"]), node("Pow", ["d", "two"], ["sq"]), mean("sq", "var"),
             node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]), node("Div", ["d", "sd"], ["n"]),
             node("Mul", ["n", "gamma"], ["ng"]), node("Add", ["ng", "beta"], ["y"])]
    affine = [c] + [1] * (len(shape) - 1 - axis % len(shape))
    inits = [const("two", 2.0), const("eps", 1e-5), weight("gamma", *affine), weight("beta", *affine)]
    if opset >= 18:
        inits.append(const("axes", [axis], np.int64))
    path = save(tmp_path / "m.onnx", nodes, {"x": shape}, ["y"], inits, opset)
    layer = only(import_onnx(path).layers)
    assert (layer.op, layer.fn) == ("norm", "layer" if fused else "layer_ops")
    ran = optimized_ops(path, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert ("LayerNormalization" in ran) == fused and ("ReduceMean" in ran) == (not fused), ran


def test_layer_norm_op(tmp_path):
    layer = only(layers_of(tmp_path, [node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                           {"x": [1, 7, 12]}, ["y"], [weight("g", 12), weight("b", 12)]))
    assert (layer.op, layer.fn, layer.in_ch, layer.in_hw) == ("norm", "layer", 12, (7, 1))


# --- weightless ops ------------------------------------------------------------------

def test_element_wise_pool_resize_softmax_and_data_ops(tmp_path):
    nodes = [
        node("MaxPool", ["x"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),                # 8x8 -> 4x4
        node("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),        # 4x4
        node("Concat", ["mp", "ap"], ["cat"], axis=1),                                       # 8 channels
        node("Split", ["cat", "halves"], ["s1", "s2"], axis=1),
        node("Mul", ["s1", "s2"], ["mul"]),
        node("Resize", ["mul", "", "scales"], ["up"], mode="nearest"),                      # 4x4 -> 8x8
        node("Add", ["up", "x"], ["sum"]),
        node("GlobalAveragePool", ["sum"], ["gap"]),
        node("Reshape", ["sum", "tokens"], ["seq"]),                                          # view: no layer
        node("Transpose", ["seq"], ["tr"], perm=[0, 2, 1]),                                   # [1, 64, 4]
        node("Softmax", ["tr"], ["sm"], axis=-1),
        node("ReduceMean", ["sm"], ["y"], axes=[1], keepdims=0),                             # token mean
    ]
    inits = [const("halves", [4, 4], np.int64), const("scales", [1, 1, 2, 2]), const("tokens", [1, 4, 64], np.int64)]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 8, 8]}, ["y", "gap"], inits)
    got = [(l.op, l.fn, l.in_ch, l.in_hw, l.out_ch, l.out_hw) for l in layers]
    assert got == [
        ("pool", "max", 4, (8, 8), 4, (4, 4)),
        ("pool", "avg", 4, (4, 4), 4, (4, 4)),
        ("concat", "", 8, (4, 4), 8, (4, 4)),
        ("split", "", 8, (4, 4), 8, (4, 4)),
        ("mul", "", 4, (4, 4), 4, (4, 4)),
        ("resize", "nearest", 4, (4, 4), 4, (8, 8)),
        ("add", "", 4, (8, 8), 4, (8, 8)),
        ("pool", "avg", 4, (8, 8), 4, (1, 1)),
        ("data", "inner", 64, (4, 1), 4, (64, 1)),  # tokens <-> channels: the innermost dim moves
        ("softmax", "", 4, (64, 1), 4, (64, 1)),
        ("pool", "strided", 4, (64, 1), 4, (1, 1)),  # a mean over tokens, with channels inside them
    ]
    assert layers[0].kernel == (2, 2) and layers[0].stride == 2 and layers[7].kernel == (8, 8)
    assert layers[10].kernel == (64, 1)


def test_shape_arithmetic_costs_nothing_and_is_folded_for_shapes(tmp_path):
    # torch's `x.chunk(2, dim=1)`: Shape -> Gather -> Div -> Slice, which shape inference's
    # data propagation cannot follow (Div)
    nodes = [node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "one"], ["c"]),
             node("Div", ["c", "two"], ["half"]), node("Unsqueeze", ["half", "zero"], ["end"]),
             node("Slice", ["x", "start", "end", "axis"], ["a"]), node("Conv", ["a", "w"], ["y"])]
    inits = [const("one", 1, np.int64), const("two", 2, np.int64), const("zero", [0], np.int64),
             const("start", [0], np.int64), const("axis", [1], np.int64), weight("w", 2, 4, 1, 1)]
    layers = layers_of(tmp_path, nodes, {"x": [1, 8, 3, 3]}, ["y"], inits)
    assert [(l.op, l.fn, l.out_ch) for l in layers] == [("data", "slice", 4), ("conv", "", 2)]
    assert layers[1].macs == 9 * 2 * 4


def test_chained_shape_arithmetic_is_folded_pass_by_pass_each_node_once(tmp_path, monkeypatch):
    # a chunk of a chunk: the second one's shape arithmetic can be folded only once shape
    # inference, run again, knows the first slice's shape; what the first pass folded is not
    # computed again
    from nasctl.hardware import onnx_import

    divided = []
    monkeypatch.setitem(onnx_import._FOLD, "Div", lambda attrs, a, b: divided.append(1) or a // b)

    def chunk(x, out, tag):
        return [node("Shape", [x], [f"s{tag}"]), node("Gather", [f"s{tag}", "one"], [f"c{tag}"]),
                node("Div", [f"c{tag}", "two"], [f"h{tag}"]), node("Unsqueeze", [f"h{tag}", "zero"], [f"e{tag}"]),
                node("Slice", [x, "start", f"e{tag}", "axis"], [out])]

    nodes = chunk("x", "a", 1) + chunk("a", "b", 2) + [node("Conv", ["b", "w"], ["y"])]
    inits = [const("one", 1, np.int64), const("two", 2, np.int64), const("zero", [0], np.int64),
             const("start", [0], np.int64), const("axis", [1], np.int64), weight("w", 2, 4, 1, 1)]
    layers = layers_of(tmp_path, nodes, {"x": [1, 16, 3, 3]}, ["y"], inits)
    assert [(l.op, l.fn, l.out_ch) for l in layers] == [("data", "slice", 8), ("data", "slice", 4), ("conv", "", 2)]
    assert len(divided) == 2


# --- quantized models ----------------------------------------------------------------

@pytest.mark.parametrize("elem, np_type, bits, opset", [
    (T.INT8, np.int8, 8, 17), (T.UINT8, np.uint8, 8, 17), (T.INT16, np.int16, 16, 21),
    (T.INT4, None, 4, 21), (T.UINT4, None, 4, 21),
])
def test_qdq_conv_and_matmul_take_bits_from_zero_points(tmp_path, elem, np_type, bits, opset):
    def zp(name, shape=()):
        if np_type is not None:
            return numpy_helper.from_array(np.zeros(shape, np_type), name)
        return helper.make_tensor(name, elem, shape, [0] * int(np.prod(shape)))

    wq = helper.make_tensor("wq", elem, [8, 4, 3, 3], [1] * 288)
    mq = helper.make_tensor("mq", elem, [8, 6], [1] * 48)
    nodes = [node("QuantizeLinear", ["x", "s", "zp"], ["xq"]), node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             node("DequantizeLinear", ["wq", "s", "zp"], ["wd"]),
             node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             node("QuantizeLinear", ["c", "s", "zp"], ["cq"]), node("DequantizeLinear", ["cq", "s", "zp"], ["cd"]),
             node("Relu", ["cd"], ["r"]),
             node("GlobalAveragePool", ["r"], ["p"]), node("Flatten", ["p"], ["f"]),
             node("QuantizeLinear", ["f", "s", "zp"], ["fq"]), node("DequantizeLinear", ["fq", "s", "zp"], ["fd"]),
             node("DequantizeLinear", ["mq", "s", "zp"], ["md"]), node("MatMul", ["fd", "md"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 6, 6]}, ["y"], [wq, mq, const("s", 0.1), zp("zp")], opset=opset)
    assert [(l.op, l.fn, l.w_bits, l.a_bits) for l in layers] == [
        ("conv", "relu", bits, bits), ("pool", "avg", 32, 32), ("linear", "", bits, bits)]
    assert layers[0].macs == 6 * 6 * 8 * 4 * 9 and layers[2].macs == 8 * 6


def test_qlinear_and_integer_ops_have_their_bit_widths(tmp_path):
    q = [const("s", 0.1), numpy_helper.from_array(np.array(0, np.uint8), "zu"),
         numpy_helper.from_array(np.array(0, np.int8), "zi")]
    nodes = [node("QLinearConv", ["x", "s", "zu", "w", "s", "zi", "s", "zu"], ["c"], pads=[1, 1, 1, 1]),
             node("ConvInteger", ["c", "w2", "zu", "zi"], ["ci"]),
             node("Flatten", ["c"], ["f"]),
             node("QLinearMatMul", ["f", "s", "zu", "m", "s", "zi", "s", "zu"], ["qm"]),
             node("MatMulInteger", ["qm", "m2", "zu", "zi"], ["y"])]
    inits = [weight("w", 8, 4, 3, 3, dtype=np.int8), weight("w2", 2, 8, 1, 1, dtype=np.int8),
             weight("m", 8 * 36, 10, dtype=np.int8), weight("m2", 10, 3, dtype=np.int8), *q]
    layers = layers_of(tmp_path, nodes, {"x": ([1, 4, 6, 6], T.UINT8)}, ["y", "ci"], inits)
    assert [(l.op, l.w_bits, l.a_bits, l.in_ch, l.out_ch) for l in layers] == [
        ("conv", 8, 8, 4, 8), ("conv", 8, 8, 8, 2), ("linear", 8, 8, 288, 10), ("linear", 8, 8, 10, 3)]
    assert layers[0].macs == 6 * 6 * 8 * 4 * 9


# --- what cannot be priced -----------------------------------------------------------

def test_unsupported_ops_are_counted_not_dropped(tmp_path):
    nodes = [node("Relu", ["x"], ["r"]), node("TopK", ["r", "k"], ["v", "i"], axis=-1), node("Det", ["m"], ["d"]),
             node("Det", ["m"], ["d2"])]
    result = import_onnx(save(tmp_path / "m.onnx", nodes, {"x": [1, 10], "m": [1, 3, 3]}, ["v", "i", "d", "d2"],
                              [const("k", [3], np.int64)]))
    assert result.unsupported == Counter({"Det": 2, "TopK": 1})
    assert [(l.op, l.fn) for l in result.layers] == [("act", "relu")]
    assert result.nodes == 4


def test_handler_table_can_be_extended_and_overridden(tmp_path):
    path = save(tmp_path / "m.onnx", [node("Relu", ["x"], ["r"]), node("Det", ["r"], ["y"])], {"x": [1, 3, 3]}, ["y"])

    def det(n, g):
        return [g.layer("data", n, n.inputs[0], n.outputs[0], fn="det")]

    result = import_onnx(path, handlers={**HANDLERS, "Det": det, "Relu": lambda n, g: None})
    assert result.unsupported == Counter({"Relu": 1})
    assert [(l.op, l.fn) for l in result.layers] == [("data", "det")]


# --- input shapes and bad files ------------------------------------------------------

def _dynamic(tmp_path):
    return save(tmp_path / "dyn.onnx", [node("Conv", ["image", "w"], ["y"])], {"image": ["N", 3, "H", "W"]}, ["y"],
                [weight("w", 8, 3, 1, 1)])


def test_dynamic_dims_need_an_input_shape(tmp_path):
    path = _dynamic(tmp_path)
    with pytest.raises(UsageError, match=r"dyn.onnx: input 'image' has dynamic dims \[N, 3, H, W\]; "
                                         r"give them with --input-shape image:Nx3xNxN"):
        import_onnx(path)
    for shapes in ({None: (1, 3, 20, 10)}, {"image": (1, 3, 20, 10)}):
        layer = only(import_onnx(path, shapes).layers)
        assert (layer.in_hw, layer.macs) == ((20, 10), 200 * 8 * 3)


@pytest.mark.parametrize("shapes, message", [
    ({"img": (1, 3, 8, 8)}, "--input-shape: the model has no input 'img'; its inputs: image"),
    ({None: (1, 3, 8)}, "--input-shape image: 3 dims given; the input has 4 [N, 3, H, W]"),
    ({None: (2, 3, 8, 8)}, "input 'image' has batch 2; nasctl prices one input at a time: "
                           "give --input-shape image:1x3x8x8"),
    ({None: (1, 3, 0, 8)}, "input 'image' has shape [1, 3, 0, 8]; every dim must be 1 or more"),
])
def test_bad_input_shapes(tmp_path, shapes, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        import_onnx(_dynamic(tmp_path), shapes)


@pytest.mark.parametrize("declared, given, message", [
    (["N", 3, "H", "W"], (1, 5, 32, 32), "--input-shape image:1x5x32x32: the input is declared [N, 3, H, W] "
                                         "(dim 1 is 3, 5 given); only its dynamic dims can be set: "
                                         "give image:1x3x32x32"),
    ([1, 3, 8, 8], (1, 3, 16, 16), "declared [1, 3, 8, 8] (dim 2 is 8, 16 given; dim 3 is 8, 16 given)"),
])
def test_input_shape_cannot_change_a_static_dim(tmp_path, declared, given, message):
    path = save(tmp_path / "m.onnx", [node("Conv", ["image", "w"], ["y"])], {"image": declared}, ["y"],
                [weight("w", 8, 3, 1, 1)])
    with pytest.raises(UsageError) as info:
        import_onnx(path, {None: given})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_input_shape_may_repeat_static_dims_and_set_a_static_batch_to_one(tmp_path):
    path = save(tmp_path / "m.onnx", [node("Conv", ["image", "w"], ["y"])], {"image": [4, 3, "H", 8]}, ["y"],
                [weight("w", 8, 3, 1, 1)])
    result = import_onnx(path, {"image": (1, 3, 6, 8)})
    assert result.inputs == {"image": (1, 3, 6, 8)} and only(result.layers).macs == 48 * 8 * 3


@pytest.mark.parametrize("nodes, inputs, inits, message", [
    ([node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 8, 8]}, [weight("w", 8, 5, 3, 3)],
     "node 'y' (Conv): input 'x' [1, 3, 8, 8] has 3 channels, but weight 'w' [8, 5, 3, 3] with group 1 takes 5"),
    ([node("Conv", ["x", "w"], ["y"], group=2)], {"x": [1, 8, 8, 8]}, [weight("w", 8, 8, 3, 3)],
     "node 'y' (Conv): input 'x' [1, 8, 8, 8] has 8 channels, but weight 'w' [8, 8, 3, 3] with group 2 takes 16"),
    ([node("Conv", ["x", "w"], ["y"], group=3)], {"x": [1, 6, 8, 8]}, [weight("w", 8, 2, 3, 3)],
     "node 'y' (Conv): weight 'w' [8, 2, 3, 3] does not split into group 3"),
    ([node("ConvTranspose", ["x", "w"], ["y"])], {"x": [1, 3, 8, 8]}, [weight("w", 4, 8, 2, 2)],
     "node 'y' (ConvTranspose): input 'x' [1, 3, 8, 8] has 3 channels, but weight 'w' [4, 8, 2, 2]"),
    ([node("MatMul", ["x", "w"], ["y"])], {"x": [1, 4, 16]}, [weight("w", 12, 8)],
     "node 'y' (MatMul): inner dimensions differ: 'x' [1, 4, 16] gives 16, 'w' [12, 8] takes 12"),
    ([node("MatMul", ["q", "k"], ["y"])], {"q": [1, 2, 5, 8], "k": [1, 2, 5, 5]}, [],
     "node 'y' (MatMul): inner dimensions differ: 'q' [1, 2, 5, 8] gives 8, 'k' [1, 2, 5, 5] takes 5"),
    ([node("Gemm", ["x", "w"], ["y"], transB=1)], {"x": [1, 16]}, [weight("w", 8, 12)],
     "node 'y' (Gemm): inner dimensions differ: 'x' [1, 16] gives 16, 'w' [8, 12] transposed takes 12"),
])
def test_weights_that_do_not_fit_their_input_are_refused_naming_the_node(tmp_path, nodes, inputs, inits, message):
    path = save(tmp_path / "m.onnx", nodes, inputs, ["y"], inits)
    with pytest.raises(UsageError) as info:
        import_onnx(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_shape_given_for_a_dynamic_input_must_fit_the_weights(tmp_path):
    with pytest.raises(UsageError, match=r"node 'y' \(Conv\): input 'image' \[1, 5, 8, 8\] has 5 channels"):
        import_onnx(save(tmp_path / "m.onnx", [node("Conv", ["image", "w"], ["y"])], {"image": ["N", "C", "H", "W"]},
                         ["y"], [weight("w", 8, 3, 1, 1)]), {None: (1, 5, 8, 8)})


def test_an_opset_or_ir_version_newer_than_onnx_knows_is_refused(tmp_path):
    newest, ml = onnx.defs.onnx_opset_version(), onnx.defs.onnx_ml_opset_version()
    cases = {"opset.onnx": ([helper.make_opsetid("", 99)], None,
                            f"opset 99 (default ai.onnx domain) is newer than the installed onnx {onnx.__version__} "
                            f"supports (up to {newest})"),
             "ml.onnx": ([helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", ml + 1)], None,
                         f"opset {ml + 1} (ai.onnx.ml domain) is newer than the installed onnx"),
             "zero.onnx": ([helper.make_opsetid("", 0)], None, "opset 0 (default ai.onnx domain) is not an opset"),
             "ir.onnx": ([helper.make_opsetid("", 17)], 99,
                         f"ONNX IR version 99 is newer than the installed onnx {onnx.__version__} reads "
                         f"(up to {onnx.IR_VERSION})")}
    graph = helper.make_graph([node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                              [helper.make_empty_tensor_value_info("y")])
    for name, (opsets, ir, message) in cases.items():
        model = helper.make_model(graph, opset_imports=opsets)
        if ir is not None:
            model.ir_version = ir
        onnx.save(model, tmp_path / name)
        with pytest.raises(UsageError) as info:
            import_onnx(tmp_path / name)
        text = str(info.value)
        assert text.startswith(f"{tmp_path / name}: ") and message in text and "\n" not in text
    # a domain onnx does not define (a runtime's contrib ops) is left to the handlers
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", newest),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, tmp_path / "ok.onnx")
    assert [l.op for l in import_onnx(tmp_path / "ok.onnx").layers] == ["act"]


def test_bad_files_fail_in_one_line_naming_the_file(tmp_path):
    good = save(tmp_path / "good.onnx", [node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 8, 8]}, ["y"],
                [weight("w", 8, 3, 3, 3)])
    data = good.read_bytes()
    (tmp_path / "notes.txt").write_text("not a model\n")
    (tmp_path / "empty.onnx").write_bytes(b"")
    cases = {"missing.onnx": "no such file", "notes.txt": "not an ONNX model", "empty.onnx": "not a complete",
             ".": "is a folder"}
    for cut in (len(data) // 4, len(data) // 2, len(data) - 3, len(data) - 1):
        (tmp_path / f"cut{cut}.onnx").write_bytes(data[:cut])
        cases[f"cut{cut}.onnx"] = "ONNX model"
    for name, message in cases.items():
        with pytest.raises(UsageError) as info:
            import_onnx(tmp_path / name)
        text = str(info.value)
        assert str(tmp_path / name) in text and message in text and "\n" not in text


def test_malformed_models_fail_in_one_line_naming_what_is_wrong(tmp_path):
    x = helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])

    def model(nodes, inputs=(x,), inits=()):
        graph = helper.make_graph(nodes, "g", list(inputs), [helper.make_empty_tensor_value_info("y")], list(inits))
        return onnx_model(graph)

    cases = {
        "rank.onnx": (model([node("Conv", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", T.FLOAT, [1, 3])],
                            [weight("w", 8, 3, 3, 3)]),
                      "node 'y' (Conv): input 'x' [1, 3] has rank 2, but weight 'w' [8, 3, 3, 3] takes rank 4"),
        "pool.onnx": (model([node("MaxPool", ["x"], ["y"])]),
                      "node 'y' (MaxPool): no kernel_shape attribute, which MaxPool requires"),
        "scalar.onnx": (model([node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", T.FLOAT, [])],
                              [weight("w", 4)]), "node 'y' (MatMul): 'x' is a scalar"),
        "twice.onnx": (model([node("Relu", ["x"], ["y"]), node("Sigmoid", ["x"], ["y"])]),
                       "not a valid ONNX model (node 'y' writes tensor 'y', which is already defined)"),
        "seq.onnx": (model([node("Identity", ["x"], ["y"])], [helper.make_tensor_sequence_value_info("x", T.FLOAT, [1])]),
                     "input 'x' is a sequence, not a tensor"),
        "untyped.onnx": (model([node("Relu", ["x"], ["y"])], [helper.make_empty_tensor_value_info("x")]),
                         "input 'x' has no type"),
        "rankless.onnx": (model([node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", T.FLOAT, None)]),
                          "input 'x' has no declared shape; give it with --input-shape x:DIMS"),
    }
    for name, (m, message) in cases.items():
        onnx.save(m, tmp_path / name)
        with pytest.raises(UsageError) as info:
            import_onnx(tmp_path / name)
        text = str(info.value)
        assert name in text and message in text and "\n" not in text, (name, text)


def test_inconsistent_shapes_are_noted_and_what_cannot_be_shaped_is_counted(tmp_path):
    nodes = [node("Relu", ["x"], ["r"]), node("Add", ["r", "z"], ["y"])]
    result = import_onnx(save(tmp_path / "m.onnx", nodes, {"x": [1, 3], "z": [1, 4]}, ["y"]))
    note, ran = result.notes
    assert note.startswith("shape inference (strict) failed, shapes taken leniently:") and "Add" in note
    assert "running the model once to find them failed" in ran  # onnxruntime cannot run it either
    assert result.unsupported == Counter({"Add (shape unknown)": 1})
    assert [(l.op, l.fn) for l in result.layers] == [("act", "relu")]


# --- shapes shape inference cannot find -----------------------------------------------

def _ms_model(path, opsets):
    """com.microsoft.Gelu (an op onnx's shape inference does not know) before a conv."""
    nodes = [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", name="gelu"),
             node("Conv", ["g", "w"], ["y"], pads=[1, 1, 1, 1]), node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 8, 20, 20])],
                              [helper.make_empty_tensor_value_info("z")], [weight("w", 16, 8, 3, 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def test_shapes_inference_cannot_find_are_read_from_one_run_of_the_model(tmp_path):
    result = import_onnx(_ms_model(tmp_path / "m.onnx", [("", 17), ("com.microsoft", 1)]))
    assert not result.unsupported
    assert [(l.op, l.fn, l.in_ch, l.out_ch, l.out_hw) for l in result.layers] == [
        ("act", "gelu", 8, 8, (20, 20)), ("conv", "relu", 8, 16, (20, 20))]
    assert any("read from one run of the model with onnxruntime" in n for n in result.notes)


def test_shape_computations_without_a_folding_rule_fold_by_onnx_reference_ops(tmp_path):
    # Reshape's target is Relu(Shape(x)): no rule here and no data propagation in onnx
    nodes = [node("Shape", ["x"], ["s"]), node("Relu", ["s"], ["t"]), node("Reshape", ["x", "t"], ["r"]),
             node("Conv", ["r", "w"], ["y"])]
    result = import_onnx(save(tmp_path / "m.onnx", nodes, {"x": [1, 8, 6, 6]}, ["y"],
                              [weight("w", 4, 8, 1, 1)]))
    assert not result.unsupported and not result.notes  # found without running the model
    assert [(l.op, l.in_ch, l.out_ch, l.out_hw) for l in result.layers] == [("conv", 8, 4, (6, 6))]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL2", "ReduceMax", "ReduceMin"])
def test_reductions_are_pools_over_the_reduced_positions(tmp_path, op):
    nodes = [node(op, ["x", "axes"], ["y"], keepdims=1)]
    layer = only(layers_of(tmp_path, nodes, {"x": [1, 16, 8, 8]}, ["y"], [const("axes", [2, 3], np.int64)],
                           opset=18))
    assert (layer.op, layer.in_ch, layer.out_hw, layer.kernel) == ("pool", 16, (1, 1), (8, 8))
    # an L2 norm has no fast path in onnxruntime, even over the innermost axes
    assert layer.fn == {"ReduceMax": "max", "ReduceMin": "max", "ReduceL2": "strided"}.get(op, "avg")


def test_large_weights_import_without_their_values(tmp_path):
    # the weights' values are never read: a weight of 4M values imports like a small one
    nodes = [node("MatMul", ["x", "w"], ["y"])]
    big = numpy_helper.from_array(np.zeros((2048, 2048), np.float32), "w")
    layer = only(layers_of(tmp_path, nodes, {"x": [1, 4, 2048]}, ["y"], [big]))
    assert (layer.op, layer.in_ch, layer.out_ch, layer.params) == ("linear", 2048, 2048, 2048 * 2048)
    from nasctl.hardware.onnx_import import load_model

    model = load_model(tmp_path / "m.onnx")  # parsed without the weight's 16 MB of values
    w, = model.graph.initializer
    assert (w.name, list(w.dims), w.data_type, w.raw_data) == ("w", [2048, 2048], T.FLOAT, b"")
    assert model.ByteSize() < 10_000


# Measured with onnxruntime alone on 65,536 floats (benchmarks/README.md): ns per element.
# The label: "strided" (copied in small pieces), "inner" (the innermost of the dims over 1
# moves), else "transpose" (whole blocks of the innermost dims copied at a time).
TRANSPOSES = [
    ([1, 64, 256, 4], [0, 3, 2, 1], "strided"),   # 3.4: the innermost axis moves among others
    ([1, 64, 256, 4], [0, 3, 1, 2], "inner"),     # 0.18: one axis moved outwards, 4-byte blocks
    ([1, 64, 256, 4], [0, 2, 3, 1], "inner"),     # 0.79: one axis moved inwards
    ([1, 64, 256, 4], [0, 2, 1, 3], "strided"),   # 2.2: one axis moved outwards, blocks of 4 floats
    ([1024, 16, 2, 2], [0, 2, 1, 3], "transpose"),  # 0.33: blocks of 8 bytes
    ([64, 16, 4, 16], [0, 2, 1, 3], "transpose"),   # 0.66: blocks of 16 floats
    ([16, 4, 16, 64], [2, 0, 3, 1], "strided"),   # 3.7
    ([1, 8, 8, 32, 32], [0, 2, 1, 3, 4], "transpose"),  # 0.20: ShuffleNet's channel shuffle
    ([8, 8, 32, 32], [1, 0, 3, 2], "strided"),    # 3.4 (equal sizes: not a reshape)
    ([1, 64, 16, 16, 2, 2], [0, 1, 3, 5, 2, 4], "strided"),  # 3.9: MobileViT-style unfold
    ([1, 1, 64, 8], [1, 0, 2, 3], "transpose"),   # dims of 1 moved: a plain copy
    ([1, 16, 1, 16], [0, 2, 3, 1], "inner"),      # attention's keys, 1 head of 16 over 16 tokens
    ([1, 16, 1, 16], [0, 2, 1, 3], "transpose"),  # its split into heads: the same folded shapes
]


@pytest.mark.parametrize("shape,perm,label", TRANSPOSES)
def test_transposes_are_labelled_by_how_onnxruntime_copies_them(tmp_path, shape, perm, label):
    shape, perm = [1, *shape], [0, *(p + 1 for p in perm)]  # one input at a time: a batch of 1 in front
    out = [shape[p] for p in perm]
    layer = only(layers_of(tmp_path, [node("Transpose", ["x"], ["y"], perm=perm)], {"x": shape}, ["y"]))
    assert (layer.op, layer.fn) == ("data", label), (shape, perm, out)


@pytest.mark.parametrize("shape,perm,copies", [
    ([1, 16, 4, 12], [0, 2, 1, 3], 64),      # attention heads split: blocks of 12 floats
    ([1, 4, 16, 12], [0, 2, 1, 3], 64),      # and merged
    ([1, 16, 4, 12], [0, 3, 2, 1], 768),     # the innermost axis moves: a copy per element
    ([1, 16, 48], [0, 2, 1], 768),           # tokens <-> channels
    ([1, 64, 8, 8, 16], [0, 2, 1, 3, 4], 512),  # a 5-d channel shuffle: blocks of 128 floats
    ([1, 101, 3, 3, 64], [2, 0, 3, 1, 4], 909),  # timm's q, k, v heads: blocks of 64 floats, not 1
])
def test_a_transposes_copies_are_counted_from_the_layer_the_importer_reads(tmp_path, shape, perm, copies):
    # `lut._copies` reads the copies from the layer's (channels, positions) shapes alone,
    # which is all a search candidate's layer list holds; a transpose of rank 5 or more is
    # read as the rank-4 one moving the same data (`layers.transpose_view`).
    from nasctl.hardware.lut import _copies

    layer = only(layers_of(tmp_path, [node("Transpose", ["x"], ["y"], perm=perm)], {"x": shape}, ["y"]))
    assert _copies(layer) == copies


@pytest.mark.parametrize("op,shape,axes,keep,strided", [
    ("ReduceMean", [1, 160, 32, 32], [2, 3], 1, False),  # 0.12 ns per element: the innermost axes
    ("ReduceMax", [1, 48, 1024], [2], 0, False),         # 0.23
    ("ReduceL2", [1, 48, 1024], [2], 1, True),           # 0.98: a norm, even of the innermost axis
    ("ReduceSumSquare", [1, 160, 32, 32], [2, 3], 0, True),  # 0.81
    ("ReduceMean", [1, 32, 32, 160], [1, 2], 1, True),   # 0.84: channels-last, channels inside
    ("ReduceMean", [1, 197, 192], [1], 0, True),         # a mean over tokens
])
def test_reductions_are_labelled_by_whether_onnxruntime_has_a_fast_path(tmp_path, op, shape, axes, keep, strided):
    out = [1 if i in axes else d for i, d in enumerate(shape)] if keep else \
        [d for i, d in enumerate(shape) if i not in axes]
    nodes = [node(op, ["x", "axes"], ["y"], keepdims=keep)]
    layer = only(layers_of(tmp_path, nodes, {"x": shape}, ["y"], [const("axes", axes, np.int64)], opset=18))
    assert layer.op == "pool" and (layer.fn == "strided") == strided, (op, shape, axes, out)


@pytest.mark.parametrize("quantized", [False, True])
def test_a_gather_from_a_dequantized_table_runs_at_every_inference_and_is_priced(tmp_path, quantized):
    """LeViT's attention biases, a 4 x 49 table gathered along its last axis by 49 x 49
    indices: onnxruntime folds the gather where the table is a float weight, and runs it at
    every inference where the table is dequantized from int8 (it folds no DequantizeLinear);
    each index copies one element (fn `strided`), not a block."""
    from nasctl.hardware.layers import STRIDED

    idx = numpy_helper.from_array(RNG.integers(0, 49, (49, 49)).astype(np.int64), "idx")
    scale, zero = const("s", 0.1), numpy_helper.from_array(np.array(0, np.int8), "zp")
    if quantized:
        table = [numpy_helper.from_array(RNG.integers(-100, 100, (4, 49)).astype(np.int8), "tq"), scale, zero]
        nodes = [node("DequantizeLinear", ["tq", "s", "zp"], ["table"])]
    else:
        table, nodes = [weight("table", 4, 49)], []
    nodes += [node("Gather", ["table", "idx"], ["bias"], axis=1), node("Add", ["x", "bias"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 4, 49, 49]}, ["y"], [idx, *table])
    gathers = [layer for layer in layers if layer.op == "data"]
    assert [layer.op for layer in layers if layer.op != "data"] == ["add"]
    if quantized:
        assert [(g.fn, g.out_elems) for g in gathers] == [(STRIDED, 4 * 49 * 49)]
    else:
        assert gathers == []


def test_a_gather_of_whole_rows_is_not_strided(tmp_path):
    """An embedding lookup copies a row of the table per index: a block, not elements."""
    inits = [weight("emb", 100, 64)]
    layer = only(layers_of(tmp_path, [node("Gather", ["emb", "ids"], ["y"], axis=0)],
                           {"ids": ([1, 16], T.INT64)}, ["y"], inits))
    assert (layer.op, layer.fn) == ("data", "gather")


@pytest.mark.parametrize("scale_shape, folded", [
    ((), True), ((8, 1, 1), True), ((1, 8, 1, 1), True),  # a scalar or one per channel: ConvMulFusion
    ((1,), False), ((1, 1, 1), False), ((1, 8, 4, 4), False),  # shapes onnxruntime leaves as a Mul
])
def test_a_layer_scale_after_a_conv_is_folded_where_onnxruntime_folds_it(tmp_path, scale_shape, folded):
    """ConvNeXt's and FastViT's layer scales, conv output x gamma (C x 1 x 1): onnxruntime
    folds a constant scalar or per-channel Mul into the conv's weights, and runs any other
    shape as a Mul (checked against its optimized graph)."""
    import onnxruntime as ort

    inits = [weight("w", 8, 3, 3, 3), numpy_helper.from_array(np.ones(scale_shape, np.float32), "g")]
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Mul", ["c", "g"], ["y"])]
    path = save(tmp_path / "m.onnx", nodes, {"x": [1, 3, 4, 4]}, ["y"], inits)
    layers = import_onnx(path).layers
    assert [layer.op for layer in layers] == (["conv"] if folded else ["conv", "mul"])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    assert ("Mul" in {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}) == (not folded)


@pytest.mark.parametrize("op, value, first, runs", [
    ("Add", 0.0, False, False), ("Add", 0.0, True, False), ("Mul", 1.0, True, False), ("Sub", 0.0, False, False),
    ("Div", 1.0, False, False), ("Mul", [[[1.0]]] * 8, False, False),  # ones per channel
    ("Sub", 0.0, True, True), ("Div", 1.0, True, True)])  # 0 - x, 1 / x
def test_an_elementwise_op_of_a_neutral_constant_runs_nothing_and_the_relu_after_it_fuses(tmp_path, op, value,
                                                                                           first, runs):
    """onnxruntime removes an add of zeros or a product by ones (either side), a
    subtraction of zeros or a division by ones (constant second), and fuses the conv
    before with the relu after (MobileOne's blocks export an add of 0 after their summed
    convs: priced as adds, 1.7% of its price); 0 - x and 1 / x still run."""
    inits = [weight("w", 8, 3, 3, 3), const("k", value)]
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node(op, ["k", "c"] if first else ["c", "k"], ["a"]),
             node("Relu", ["a"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 3, 4, 4]}, ["y"], inits)
    if runs:
        assert len(layers) == 3 and layers[0].op == "conv" and not layers[0].fn, layers
    else:
        assert [(layer.op, layer.fn) for layer in layers] == [("conv", "relu")]


def test_a_neutral_constant_stored_apart_is_read_from_its_file(tmp_path):
    """ConvNeXt-V2's response-norm biases, zeros as first set, exported with the weights in
    a file beside the model: read from there, the add of them runs nothing; with the file
    gone the add is priced (nothing read, nothing assumed)."""
    nodes = [node("Relu", ["x"], ["r"]), node("Add", ["r", "k"], ["a"]), node("Sigmoid", ["a"], ["y"])]
    path = save(tmp_path / "m.onnx", nodes, {"x": [1, 8, 4, 4]}, ["y"], [const("k", np.zeros((1, 8, 1, 1)))])
    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
              size_threshold=0)
    assert [layer.op for layer in import_onnx(path).layers] == ["act", "act"]
    (tmp_path / "m.onnx.data").rename(tmp_path / "elsewhere.data")
    assert [layer.op for layer in import_onnx(path).layers] == ["act", "add", "act"]


def test_a_neutral_constant_that_broadcasts_to_a_larger_shape_still_runs(tmp_path):
    """x + zeros of a larger shape is not x: the add stays."""
    nodes = [node("Relu", ["x"], ["r"]), node("Add", ["r", "k"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 3, 4, 4]}, ["y"], [const("k", np.zeros((2, 3, 4, 4)))])
    assert [layer.op for layer in layers] == ["act", "add"]


def test_a_layer_scale_is_not_folded_into_a_conv_whose_output_is_read_elsewhere(tmp_path):
    inits = [weight("w", 8, 3, 3, 3), numpy_helper.from_array(np.full((8, 1, 1), 0.5, np.float32), "g")]
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Mul", ["c", "g"], ["m"]),
             node("Add", ["m", "c"], ["y"])]
    layers = layers_of(tmp_path, nodes, {"x": [1, 3, 4, 4]}, ["y"], inits)
    assert [layer.op for layer in layers] == ["conv", "mul", "add"]


def test_a_gather_along_an_axis_the_data_lacks_is_one_line(tmp_path):
    inits = [weight("emb", 100, 64)]
    path = save(tmp_path / "m.onnx", [node("Gather", ["emb", "ids"], ["y"], axis=2)], {"ids": ([1, 16], T.INT64)},
                ["y"], inits)
    with pytest.raises(UsageError, match=r"axis 2 is outside -2\.\.1"):
        import_onnx(path)


def _unbind(kind: str, axis_taken: int = 0):
    """timm's attention: q, k, v out of one [1, T, 3, heads, d] tensor transposed to [3, 1,
    heads, T, d], taken apart along `axis_taken` by three Slices (opset 17 exports of
    `unbind`), three Gathers or one Split (opset 18 exports), each part read by a MatMul."""
    t, heads, d = 17, 2, 8
    nodes = [node("Reshape", ["x", "shape"], ["qkv"]), node("Transpose", ["qkv"], ["p"], perm=[2, 0, 3, 1, 4])]
    inits = [const("shape", [1, t, 3, heads, d], np.int64)]
    parts = []
    for j in range(3):
        if kind == "slice":  # as torch writes it: one axis, step 1
            nodes += [node("Slice", ["p", f"s{j}", f"e{j}", f"axis{j}", f"step{j}"], [f"part{j}"]),
                      node("Squeeze", [f"part{j}", "zero"], [f"sq{j}"])]
            inits += [const(f"s{j}", [j], np.int64), const(f"e{j}", [j + 1], np.int64),
                      const(f"axis{j}", [axis_taken], np.int64), const(f"step{j}", [1], np.int64)]
            parts.append(f"sq{j}")
        elif kind == "gather":
            nodes.append(node("Gather", ["p", f"i{j}"], [f"sq{j}"], axis=axis_taken))
            inits.append(const(f"i{j}", j, np.int64))
            parts.append(f"sq{j}")
    if kind == "split":
        nodes += [node("Split", ["p"], ["a", "b", "c"], axis=axis_taken, num_outputs=3)]
        nodes += [node("Squeeze", [p, "zero"], [f"sq{j}"]) for j, p in enumerate("abc")]
        parts = [f"sq{j}" for j in range(3)]
    inits.append(const("zero", [0], np.int64))
    nodes.append(node("MatMul", [parts[0], "w"], ["q"]))
    nodes += [node("Add", [parts[1], "q"], ["qk"]), node("Add", [parts[2], "qk"], ["y"])]
    inits.append(weight("w", d, d))
    return nodes, {"x": [1, t, 3 * heads * d]}, inits


@pytest.mark.parametrize("kind", ["slice", "gather", "split"])
def test_a_transpose_taken_apart_runs_as_a_split_and_a_transpose_of_each_part(tmp_path, kind):
    """onnxruntime moves a transpose whose output is taken apart along its first axis behind
    the parts (its transpose optimizer) and fuses Slices or Gathers into one Split
    (GatherSliceToSplitFusion): it runs a Split of the untransposed tensor and three
    transposes of a third of it each.  The importer prices that, not a transpose of the
    whole and three slices (DeiT-tiny at 160 px: 48 us a block priced against 22 us run)."""
    import onnxruntime as ort

    from nasctl.hardware.onnx_import import optimized_nodes

    nodes, inputs, inits = _unbind(kind)
    path = save(tmp_path / "m.onnx", nodes, inputs, ["y"], inits, opset=18)
    layers = import_onnx(path).layers
    moves = [layer for layer in layers if layer.op in ("data", "split")]
    assert [layer.op for layer in moves] == ["split", "data", "data", "data"]
    assert {layer.fn for layer in moves[1:]} <= {"transpose", "strided"}
    assert moves[0].in_ch * moves[0].in_hw[0] * moves[0].in_hw[1] == 17 * 3 * 2 * 8  # the whole tensor, once
    assert all(layer.out_ch * layer.out_hw[0] * layer.out_hw[1] == 17 * 2 * 8 for layer in moves[1:])  # a third
    ran = optimized_nodes(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert sum(n.op_type == "Split" for n in ran) == 1 and sum(n.op_type == "Transpose" for n in ran) == 3
    assert not any(n.op_type in ("Slice", "Gather") for n in ran)


def test_a_transpose_read_in_parts_that_are_not_its_first_axis_stays_a_transpose(tmp_path):
    nodes, inputs, inits = _unbind("gather", axis_taken=3)  # three of the 17 tokens: no split of the whole
    layers = import_onnx(save(tmp_path / "m.onnx", nodes, inputs, ["y"], inits, opset=18)).layers
    moves = [layer for layer in layers if layer.op in ("data", "split")]
    assert [layer.op for layer in moves] == ["data"] * 4 and moves[0].fn in ("transpose", "strided")
    assert all(layer.out_ch * layer.out_hw[0] * layer.out_hw[1] == 3 * 2 * 8 for layer in moves[1:])  # 3 gathers


@pytest.mark.parametrize("to, runs", [(T.FLOAT, False), (T.FLOAT16, True), (T.INT64, True)])
def test_a_cast_to_the_type_its_input_has_costs_nothing_as_onnxruntime_removes_it(tmp_path, to, runs):
    """EfficientViT exports float-to-float Casts around its attention; onnxruntime drops
    them when it loads the model (checked against its optimized graph), but for one that
    writes an output of the model; a cast to another type runs as a data movement."""
    inits = [weight("w", 8, 3, 3, 3)]
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Cast", ["c"], ["k"], to=to),
             node("Cast", ["k"], ["y"], to=T.FLOAT)]  # (a cast writing a graph output is kept)
    path = save(tmp_path / "m.onnx", nodes, {"x": [1, 3, 4, 4]}, ["y"], inits)
    layers = import_onnx(path).layers
    assert [(layer.op, layer.fn) for layer in layers] == [("conv", "")] + [("data", "cast")] * (2 if runs else 1)
    assert all(layer.out_elems == 8 * 4 * 4 for layer in layers)
    import onnxruntime as ort

    cast = [n for n in onnx.load(str(tmp_path / "m.onnx")).graph.node if n.op_type == "Cast"]
    optimized_ops(path, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    kept = [n for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node if n.op_type == "Cast"]
    assert len(cast) == 2 and len(kept) == (2 if runs else 1)
