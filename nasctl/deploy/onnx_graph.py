"""One ONNX graph that runs a trained early-exit network as deployed.

The graph takes one input, "input" [1, C, H, W] (float32, normalised as in training),
and gives "logits" [1, classes] and "exit" [1] (int64: the index of the exit taken, over
the network's active exits, the final classifier last).  After each early-exit head the
confidence under the exit policy is compared with the calibrated threshold; when it is
met, an `If` node returns that head's logits and the rest of the backbone is not
computed (it lies in the `If`'s else branch, where the next exit nests the same way):

    backbone to exit 0 -> head 0 -> confidence >= t0 ? (logits 0, 0)
                                                     : backbone to exit 1 -> head 1 -> ...

Quantization as trained (see `nasctl.evaluation.quant`):
  - weights below 16 bits: per-output-channel symmetric integers (-127 ... 127, or INT4 of
    ONNX opset 21) with a DequantizeLinear; batch norm is folded into the per-channel
    scale and the bias, which leaves the integer grid QAT trained on unchanged.  8-bit
    weights are stored as UINT8 about a zero point of 128 (the same values): with INT8
    weights, onnxruntime's integer convolutions on x86 CPUs without VNNI (AVX2) saturate
    16-bit intermediate sums, which cost a digits network 12 accuracy points; with UINT8
    ones it matches the trained network within a few inputs;
  - activations below 16 bits: QuantizeLinear -> DequantizeLinear (UINT8, or UINT4) with
    the scale and zero point of the range QAT learned, where the training network
    quantizes them;
  - 16 and 32 bits stay float32.
A vision transformer (`nasctl.spaces.vit_torch`) exports the same way: its linear layers on
tokens as MatMul + Add (per-output-channel weights, DequantizeLinear along axis 1 of the
[in, out] weight), layer norms as LayerNormalization, GELU as Gelu, the attention as
Reshape/Transpose into heads, MatMul, Mul by d^-1/2, Softmax and MatMul, each activation
quantizer where the training network has one.  The shapes that Reshape and ReduceMean read
are Constant nodes of their own scope, so that ONNX shape inference (and `nasctl predict`)
sees every layer's shape inside the exits' If branches too.
onnxruntime fuses 8-bit groups (DequantizeLinear -> Conv -> QuantizeLinear) into integer
kernels where each quantized tensor has one reader, with the bias rounded to int32 at the
scale input scale x weight scale (as integer kernels need; the trained network adds it
in float, so a few inputs may differ).  It runs 4-bit groups as dequantize -> float op
(it has no 4-bit kernels), which the importer reads back as such; their bias is a
separate Add, which onnxruntime folds back into the float convolution without rounding
it (rounding it gains nothing there, and on a 4-bit grid it changed 5 of 359 test answers
of a digits network).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
IR_VERSION = 10
FLOAT_BITS = 16
EXIT_PREFIX = "exit_"


class _Graph:
    """Nodes of one scope (the main graph or an If branch); initializers all go to the main graph."""

    def __init__(self, root: "_Builder"):
        self.root, self.nodes = root, []

    def node(self, op: str, inputs: Sequence[str], name: str, n_out: int = 1, **attrs) -> list[str]:
        outs = [self.root.fresh(f"{name}_{op}_out{i}") for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.root.fresh(f"{name}/{op}"), **attrs))
        return outs

    def one(self, op: str, inputs: Sequence[str], name: str, **attrs) -> str:
        return self.node(op, inputs, name, **attrs)[0]


class _Builder:
    def __init__(self):
        self.inits: list[onnx.TensorProto] = []
        self.used: set[str] = set()
        self.dequantized: dict[str, tuple[str, str, str]] = {}  # DequantizeLinear output -> its inputs

    def fresh(self, name: str) -> str:
        base, n = name, 1
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name

    def const(self, name: str, value: np.ndarray, dtype: int | None = None) -> str:
        name = self.fresh(name)
        if dtype in (TensorProto.INT4, TensorProto.UINT4):
            self.inits.append(helper.make_tensor(name, dtype, list(value.shape), value.astype(np.int64).ravel().tolist()))
        else:
            self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name


def _act_qparams(quant) -> tuple[float, int] | None:
    """(scale, zero point) of an `ActQuant` in eval mode, or None where it passes values through."""
    if quant.bits >= FLOAT_BITS or not bool(quant.observed):
        return None
    import torch

    levels = 2 ** quant.bits - 1
    scale = ((quant.hi - quant.lo) / levels).clamp_min(1e-8)  # as ActQuant.forward computes them
    zero = torch.round(-quant.lo / scale).clamp(0, levels)
    return float(scale.float()), int(zero)


def _quantize_act(g: _Graph, x: str, quant, name: str) -> str:
    qp = _act_qparams(quant)
    if qp is None:
        return x
    scale, zero = qp
    b = g.root
    dtype = TensorProto.UINT8 if quant.bits > 4 else TensorProto.UINT4
    if quant.bits not in (4, 8):
        raise ValueError(f"{quant.bits}-bit activations cannot be exported; allowed: 4, 8, 16, 32")
    s = b.const(f"{name}.scale", np.array(scale, dtype=np.float32))
    z = (b.const(f"{name}.zero", np.array(zero, dtype=np.uint8)) if dtype == TensorProto.UINT8
         else b.const(f"{name}.zero", np.array(zero), TensorProto.UINT4))
    q = g.one("QuantizeLinear", [x, s, z], name)
    y = g.one("DequantizeLinear", [q, s, z], name)
    b.dequantized[y] = (q, s, z)
    return y


def _weight(g: _Graph, weight, bits: int, fold_scale: np.ndarray | None, name: str, transpose: bool = False) -> str:
    """The weight input of a conv or linear layer: float32, or integers -> DequantizeLinear
    (per output channel) at `bits`; `fold_scale` (per output channel) multiplies it (a
    folded batch norm).  `transpose`: a linear layer's [in, out] weight, for MatMul."""
    import torch

    from ..evaluation.quant import fake_quant_weight

    b = g.root
    w = weight.detach().float()
    fold = np.ones(w.shape[0], dtype=np.float64) if fold_scale is None else fold_scale.astype(np.float64)
    if bits >= FLOAT_BITS:
        shape = (-1,) + (1,) * (w.dim() - 1)
        value = (w.numpy().astype(np.float64) * fold.reshape(shape)).astype(np.float32)
        return b.const(f"{name}.weight", value.T.copy() if transpose else value)
    if bits not in (4, 8):
        raise ValueError(f"{bits}-bit weights cannot be exported; allowed: 4, 8, 16, 32")
    q_max = 2 ** (bits - 1) - 1
    scale = (w.abs().amax(dim=tuple(range(1, w.dim()))).clamp_min(1e-8) / q_max)
    q = torch.round(fake_quant_weight(w, bits) / scale.reshape((-1,) + (1,) * (w.dim() - 1))).clamp(-q_max, q_max)
    q = q.numpy().astype(np.int64)
    s = scale.numpy().astype(np.float64) * fold
    sign = np.where(s < 0, -1, 1)  # a negative folded scale: the integers change sign instead
    q = q * sign.reshape((-1,) + (1,) * (q.ndim - 1))
    dtype = TensorProto.INT8 if bits == 8 else TensorProto.INT4
    ws = b.const(f"{name}.weight_scale", np.abs(s).astype(np.float32))
    axis = 1 if transpose else 0
    q = q.T.copy() if transpose else q
    if dtype == TensorProto.INT8:  # as UINT8 about zero point 128 (see the module docstring)
        wq = b.const(f"{name}.weight_q", (q + 128).astype(np.uint8))
        wz = b.const(f"{name}.weight_zero", np.full(len(s), 128, np.uint8))
        return g.one("DequantizeLinear", [wq, ws, wz], f"{name}.weight", axis=axis)
    wq = b.const(f"{name}.weight_q", q, TensorProto.INT4)
    return g.one("DequantizeLinear", [wq, ws], f"{name}.weight", axis=axis)


def _conv_unit(g: _Graph, x: str, unit, name: str) -> str:
    """conv -> BN (folded) [-> ReLU6 or ReLU -> activation quantizer] of `mbv2_torch._conv_unit`
    (or of a vit's stem)."""
    conv, bn = unit[0], unit[1]
    var = bn.running_var.detach().double().numpy()
    gamma = bn.weight.detach().double().numpy()
    beta = bn.bias.detach().double().numpy()
    mean = bn.running_mean.detach().double().numpy()
    factor = gamma / np.sqrt(var + bn.eps)
    bias = beta - mean * factor
    if conv.bias is not None:
        bias = bias + conv.bias.detach().double().numpy() * factor
    w = _weight(g, conv.weight, conv.bits, factor, name)
    k = conv.kernel_size
    attrs = dict(kernel_shape=list(k), strides=list(conv.stride), pads=[conv.padding[0], conv.padding[1]] * 2,
                 group=conv.groups)
    if conv.bits >= FLOAT_BITS or conv.bits > 4:
        bname = g.root.const(f"{name}.bias", bias.astype(np.float32))
        y = g.one("Conv", [x, w, bname], name, **attrs)
    else:
        y = g.one("Conv", [x, w], name, **attrs)
        y = g.one("Add", [y, g.root.const(f"{name}.bias", bias.astype(np.float32).reshape(1, -1, 1, 1))], f"{name}.bias")
    if len(unit) > 2:
        from torch import nn

        y = (_relu6(g, y, unit[3], f"{name}.relu6") if isinstance(unit[2], nn.ReLU6)
             else g.one("Relu", [y], f"{name}.relu"))
        y = _quantize_act(g, y, unit[3], f"{name}.quant")
    return y


def _relu6(g: _Graph, x: str, quant, name: str) -> str:
    """ReLU6 before the activation quantizer `quant`.  At 4 bits it is left out where the
    quantizer's own range lies within [0, 6] (then clipping first changes no value), else
    written as Max and Min: onnxruntime cannot fuse a Clip into a 4-bit QuantizeLinear
    (it fails to load the model).  onnxruntime drops an 8-bit one the same way itself."""
    b = g.root
    qp = _act_qparams(quant)
    if qp is not None and quant.bits <= 4:
        scale, zero = qp
        if zero == 0 and (2 ** quant.bits - 1) * scale <= 6.0:
            return x
        y = g.one("Max", [x, b.const(f"{name}.min", np.array(0.0, np.float32))], f"{name}.max")
        return g.one("Min", [y, b.const(f"{name}.max", np.array(6.0, np.float32))], f"{name}.min")
    lo, hi = b.const(f"{name}.min", np.array(0.0, np.float32)), b.const(f"{name}.max", np.array(6.0, np.float32))
    return g.one("Clip", [x, lo, hi], name)


def _classifier(g: _Graph, x: str, head, name: str) -> str:
    from ..spaces import vit_torch

    if isinstance(head, vit_torch.Classifier):
        return _token_classifier(g, x, head, name)
    y = _conv_unit(g, x, head.conv, f"{name}.conv")
    y = g.one("GlobalAveragePool", [y], f"{name}.pool")
    y = g.one("Flatten", [y], f"{name}.flatten", axis=1)
    y = _quantize_act(g, y, head.pool[2], f"{name}.pool.quant")
    return _linear(g, y, head.fc, f"{name}.fc", tokens=False)


def _confidence(g: _Graph, logits: str, policy: str, classes: int, name: str) -> str:
    """Confidence [1] of a [1, classes] logits tensor (see `nasctl.evaluation.train.confidence`)."""
    b = g.root
    p = g.one("Softmax", [logits], f"{name}.softmax", axis=-1)
    if policy == "max-softmax":
        return g.one("ReduceMax", [p, b.const(f"{name}.axes", np.array([-1], np.int64))], f"{name}.max", keepdims=0)
    if policy == "entropy":
        floor = b.const(f"{name}.floor", np.array(1e-12, np.float32))
        logp = g.one("Log", [g.one("Max", [p, floor], f"{name}.clamp")], f"{name}.log")
        plogp = g.one("ReduceSum", [g.one("Mul", [p, logp], f"{name}.plogp"),
                                    b.const(f"{name}.axes", np.array([-1], np.int64))], f"{name}.sum", keepdims=0)
        scaled = g.one("Div", [plogp, b.const(f"{name}.logc", np.array(np.log(classes), np.float32))], f"{name}.norm")
        return g.one("Add", [scaled, b.const(f"{name}.one", np.array(1.0, np.float32))], f"{name}.conf")
    raise ValueError(f"exit policy '{policy}' cannot be exported; allowed: max-softmax, entropy")


def build_graph(model, input_shape: Sequence[int], classes: int, exits: Sequence[str],
                thresholds: Sequence[float], policy: str, doc: str = "") -> onnx.ModelProto:
    """The deployed graph of a trained `Mbv2Net` or `VitNet` (see the module docstring).
    `exits`: the active exits' names, final classifier last; `thresholds`: one per early exit."""
    Classifier = type(model).head_type

    if len(thresholds) != len(exits) - 1:
        raise ValueError(f"{len(exits) - 1} early exits but {len(thresholds)} thresholds")
    model.eval()
    b = _Builder()
    logits_info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, classes])  # noqa: E731
    exit_info = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, [1])  # noqa: E731
    blocks = list(model.blocks)

    def scope(start: int, x: str, k: int) -> tuple[_Graph, str, str]:
        """The nodes from block `start` on, reading `x`, reaching exit `k` next: their
        graph and its (logits, exit index) outputs."""
        g = _Graph(b)
        if x in b.dequantized and start > 0:
            # The quantized tensor crosses into the If branch and is dequantized there: onnxruntime
            # fuses a DequantizeLinear into the kernel reading it only within one graph.
            x = g.one("DequantizeLinear", list(b.dequantized[x]), f"blocks.{start}.input")
        for i in range(start, len(blocks)):
            block = blocks[i]
            name = f"blocks.{i}"
            if not isinstance(block, Classifier):
                x = _block(g, x, block, name)
                continue
            logits = _classifier(g, x, block, f"{EXIT_PREFIX}{exits[k]}" if k < len(exits) - 1 else "head")
            if k == len(exits) - 1:  # the final classifier
                index = g.one("Constant", [], "head.index", value=numpy_helper.from_array(np.array([k], np.int64)))
                return g, logits, index
            conf = _confidence(g, logits, policy, classes, f"{EXIT_PREFIX}{exits[k]}.confidence")
            t = b.const(f"{EXIT_PREFIX}{exits[k]}.threshold", np.array([thresholds[k]], np.float32))
            take = g.one("GreaterOrEqual", [conf, t], f"{EXIT_PREFIX}{exits[k]}.take")
            then = _Graph(b)
            out_l = then.one("Identity", [logits], f"{EXIT_PREFIX}{exits[k]}.logits")
            out_i = then.one("Constant", [], f"{EXIT_PREFIX}{exits[k]}.index",
                             value=numpy_helper.from_array(np.array([k], np.int64)))
            then_graph = helper.make_graph(then.nodes, f"{EXIT_PREFIX}{exits[k]}_taken", [],
                                           [logits_info(out_l), exit_info(out_i)])
            rest, rl, ri = scope(i + 1, x, k + 1)
            rest_graph = helper.make_graph(rest.nodes, f"{EXIT_PREFIX}{exits[k]}_passed", [],
                                           [logits_info(rl), exit_info(ri)])
            node_name = b.fresh(f"{EXIT_PREFIX}{exits[k]}")
            outs = [b.fresh(f"{node_name}.logits"), b.fresh(f"{node_name}.exit")]
            g.nodes.append(helper.make_node("If", [take], outs, name=node_name,
                                            then_branch=then_graph, else_branch=rest_graph))
            return g, outs[0], outs[1]
        raise ValueError("the network has no final classifier")

    main, logits, index = scope(0, "input", 0)
    main.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
    main.nodes.append(helper.make_node("Identity", [index], ["exit"], name="exit"))
    graph = helper.make_graph(main.nodes, "nasctl_export",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, *input_shape])],
                              [logits_info("logits"), exit_info("exit")], b.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nasctl",
                          doc_string=doc)
    m.ir_version = IR_VERSION
    onnx.checker.check_model(m, full_check=True)
    return m


def _block(g: _Graph, x: str, block, name: str) -> str:
    from torch import nn

    from ..spaces import vit_torch
    from ..spaces.mbv2_torch import InvertedResidual

    if isinstance(block, vit_torch.Stem):
        body = block.body
        return _conv_unit(g, _quantize_act(g, x, body[0], f"{name}.quant"), list(body[1:]), f"{name}.conv")
    if isinstance(block, vit_torch.PatchEmbed):
        return _patch_embed(g, x, block, name)
    if isinstance(block, vit_torch.Block):
        return _transformer_block(g, x, block, name)
    if isinstance(block, InvertedResidual):
        y = x
        for j, unit in enumerate(block.body):
            y = _conv_unit(g, y, unit, f"{name}.body.{j}")
        if block.residual:
            y = g.one("Add", [x, y], f"{name}.add")
        return _quantize_act(g, y, block.quant, f"{name}.quant")
    if isinstance(block, nn.Sequential):  # the stem: input quantizer -> conv unit
        return _conv_unit(g, _quantize_act(g, x, block[0], f"{name}.0"), block[1], f"{name}.1")
    raise ValueError(f"block {name} ({type(block).__name__}) cannot be exported")


# -- vision transformers (`nasctl.spaces.vit_torch`) ------------------------------------


def _linear(g: _Graph, x: str, fc, name: str, tokens: bool = True) -> str:
    """A `QLinear` on [1, T, C] tokens (MatMul + Add), or on [1, C] (Gemm)."""
    bias = g.root.const(f"{name}.bias", fc.bias.detach().float().numpy())
    if tokens:
        w = _weight(g, fc.weight, fc.bits, None, name, transpose=True)
        return g.one("Add", [g.one("MatMul", [x, w], name), bias], f"{name}.bias")
    w = _weight(g, fc.weight, fc.bits, None, name)
    return g.one("Gemm", [x, w, bias], name, transB=1)


def _layer_norm(g: _Graph, x: str, norm, name: str) -> str:
    b = g.root
    scale = b.const(f"{name}.scale", norm.weight.detach().float().numpy())
    shift = b.const(f"{name}.shift", norm.bias.detach().float().numpy())
    return g.one("LayerNormalization", [x, scale, shift], name, axis=-1, epsilon=float(norm.eps))


def _ints(g: _Graph, values: Sequence[int], name: str) -> str:
    """An int64 tensor that shapes a result (a Reshape's shape, a reduction's axes), as a
    Constant node of the same scope: ONNX shape inference reads an initializer's value in
    the main graph only, not inside an exit's If branch."""
    return g.one("Constant", [], name, value=numpy_helper.from_array(np.array(values, np.int64)))


def _reshape(g: _Graph, x: str, shape: Sequence[int], name: str) -> str:
    return g.one("Reshape", [x, _ints(g, shape, f"{name}.shape")], name)


def _patch_embed(g: _Graph, x: str, embed, name: str) -> str:
    """[input quantizer ->] conv p×p stride p -> tokens [1, T, C] -> + position -> quantizer."""
    from torch import nn

    if not isinstance(embed.quant_in, nn.Identity):  # it reads the network's input
        x = _quantize_act(g, x, embed.quant_in, f"{name}.quant_in")
    conv = embed.conv
    w = _weight(g, conv.weight, conv.bits, None, f"{name}.conv")
    p = conv.kernel_size
    y = g.one("Conv", [x, w, g.root.const(f"{name}.conv.bias", conv.bias.detach().float().numpy())], f"{name}.conv",
              kernel_shape=list(p), strides=list(conv.stride))
    c = conv.out_channels
    y = g.one("Transpose", [_reshape(g, y, [1, c, -1], f"{name}.flatten")], f"{name}.tokens", perm=[0, 2, 1])
    y = g.one("Add", [y, g.root.const(f"{name}.pos", embed.pos.detach().float().numpy())], f"{name}.position")
    return _quantize_act(g, y, embed.quant, f"{name}.quant")


def _transformer_block(g: _Graph, x: str, blk, name: str) -> str:
    """x + proj(attention(q, k, v of LayerNorm(x))), then + fc2(GELU(fc1(LayerNorm(x))))."""
    c, h = blk.q.in_features, blk.heads
    d = c // h
    n = _quantize_act(g, _layer_norm(g, x, blk.norm1[0], f"{name}.norm1"), blk.norm1[1], f"{name}.norm1.quant")
    parts = {}
    for part, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        y = _quantize_act(g, _linear(g, n, getattr(blk, part), f"{name}.{part}"), getattr(blk, f"q{part}"),
                          f"{name}.{part}.quant")
        heads = _reshape(g, y, [1, -1, h, d], f"{name}.{part}.split")
        parts[part] = g.one("Transpose", [heads], f"{name}.{part}.heads", perm=perm)
    scores = g.one("MatMul", [parts["q"], parts["k"]], f"{name}.scores")
    scores = g.one("Mul", [scores, g.root.const(f"{name}.scale", np.array(blk.scale, np.float32))], f"{name}.scaled")
    att = _quantize_act(g, g.one("Softmax", [scores], f"{name}.softmax", axis=-1), blk.qp, f"{name}.softmax.quant")
    y = _quantize_act(g, g.one("MatMul", [att, parts["v"]], f"{name}.mix"), blk.qo, f"{name}.mix.quant")
    y = _reshape(g, g.one("Transpose", [y], f"{name}.merge", perm=[0, 2, 1, 3]), [1, -1, c], f"{name}.merge")
    x = _quantize_act(g, g.one("Add", [x, _linear(g, y, blk.proj, f"{name}.proj")], f"{name}.add1"), blk.quant1,
                      f"{name}.quant1")
    n = _quantize_act(g, _layer_norm(g, x, blk.norm2[0], f"{name}.norm2"), blk.norm2[1], f"{name}.norm2.quant")
    y = g.one("Gelu", [_linear(g, n, blk.fc1, f"{name}.fc1")], f"{name}.gelu")
    y = _linear(g, _quantize_act(g, y, blk.act[1], f"{name}.gelu.quant"), blk.fc2, f"{name}.fc2")
    return _quantize_act(g, g.one("Add", [x, y], f"{name}.add2"), blk.quant2, f"{name}.quant2")


def _token_classifier(g: _Graph, x: str, head, name: str) -> str:
    """mean over tokens -> quantizer -> LayerNorm -> quantizer -> linear [-> GELU -> quantizer -> linear]."""
    from torch import nn

    y = g.one("ReduceMean", [x, _ints(g, [1], f"{name}.axes")], f"{name}.pool", keepdims=0)
    y = _quantize_act(g, y, head.quant, f"{name}.pool.quant")
    y = _quantize_act(g, _layer_norm(g, y, head.norm[0], f"{name}.norm"), head.norm[1], f"{name}.norm.quant")
    if not isinstance(head.fc, nn.Sequential):  # the final classifier
        return _linear(g, y, head.fc, f"{name}.fc", tokens=False)
    fc1, _, quant, fc2 = head.fc  # an exit head: linear -> GELU -> quantizer -> linear
    y = _quantize_act(g, g.one("Gelu", [_linear(g, y, fc1, f"{name}.fc1", tokens=False)], f"{name}.gelu"), quant,
                      f"{name}.gelu.quant")
    return _linear(g, y, fc2, f"{name}.fc2", tokens=False)
