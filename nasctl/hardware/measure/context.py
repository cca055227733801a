"""Context networks: random ONNX networks made of the blocks real models are made of.

They are built with `onnx.helper` from conv stacks, residual basic and bottleneck blocks,
grouped bottlenecks of a fixed group width (ResNeXt; RegNets of them: `_regnet_net`), inverted residuals with
squeeze-excite (either global pooling), mixed-kernel depthwise convs (MixNet), ghost
modules, ConvNeXt blocks (channels-last layer norm and linears), fire modules, dense and
shuffle units, U-Net
encoder-decoders (max pooling, nearest/linear resize or transposed conv, skip
concatenation), and transformer / mixer blocks (layer norm, linear, attention matmuls,
softmax, GELU - in half the int8 ones of a full profile written as torch exports it before
opset 20, Div/Erf/Add/Mul/Mul, which quantized runs op by op; some with a depthwise conv in
the MLP and a stand-alone activation, as PVT-v2; up to 1,600 narrow tokens, as the first
stages of hierarchical transformers),
and the blocks of conv-attention hybrids whose transposes and reductions run without
contiguous blocks (`strided_network`: MobileViT's patch unfolding, ConvNeXt-V2's GRN,
EdgeNeXt's L2-normalised transposed attention, layer norms over the channels axis), and
conv nets whose linear heads hold most of their 2-40 MB of weights (`headed_network`), and
conv nets of depthwise convs with a channel multiplier (`multiplier_network`: FastViT,
MobileOne, Xception), and residual nets of wide dense convs (`wide_network`: ResNet-style
stages of 64-512 channels), and int8 nets whose stages end in a max pool on a join
(`joined_network`: SqueezeNet's fire modules, GoogLeNet's inception blocks), and int8
RegNets (`grouped_network`) -
over inputs of 32-224 px, 3-1024 channels, kernels 1-9 (and patch embeddings), strides
1-2, dense, grouped and depthwise convs, float32 and int8 (conv nets and transformers
quantized by onnxruntime's static quantizer, QDQ, weights per tensor or per channel, as
users quantize models for onnxruntime; it runs them as QLinearConv / QGemm where it
can).  Resizes are written as
exporters write them (the coordinate mode decides whether onnxruntime runs them in its
blocked layout).  Every node of a kernel carries the kernel's tag (`TAG`) in its name, so
onnxruntime's profile can be attributed back to kernels (`attribution`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from .runner import TAG

OPSET = 20


class NetBuilder:
    """Builds a float32 ONNX graph kernel by kernel.  Each kernel gets a tag `k<n>:` that
    prefixes the names of its nodes and of the tensors they write, so onnxruntime's profile
    (whose node names derive from either) can be attributed back to kernels.  `quantize`
    makes an int8 network of one."""

    def __init__(self, rng: np.random.Generator, input_shape: Sequence[int]):
        self.rng = rng
        self.nodes: list = []
        self.inits: list = []
        self.shapes: dict[str, tuple[int, ...]] = {"input": tuple(input_shape)}
        self.kernels = 0
        self.macs = 0
        self._consts = 0
        # GELU as torch's exporter writes it before opset 20 (x * 0.5 * (1 + erf(x / sqrt 2)));
        # else the Gelu op.  Float, onnxruntime fuses the two alike; quantized, it runs the
        # Erf form's ops one by one between quantize and dequantize nodes
        self.erf_gelu = False

    # -- plumbing --
    def _tag(self) -> str:
        self.kernels += 1
        return f"k{self.kernels}:"

    def const(self, values, dtype=np.float32) -> str:
        from onnx import numpy_helper

        self._consts += 1
        name = f"c{self._consts}"
        array = np.asarray(values, dtype=dtype)
        self.inits.append(numpy_helper.from_array(array, name))
        self.shapes[name] = array.shape
        return name

    def node(self, op: str, inputs: list[str], tag: str, out: str, shape: tuple[int, ...], **attrs) -> str:
        from onnx import helper

        name = f"{tag}{out}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [name], name=f"{tag}{op.lower()}_{len(self.nodes)}", **attrs))
        self.shapes[name] = tuple(shape)
        return name

    def weight_bytes(self) -> float:
        """The initializers written so far, at 4 bytes an element (weights, biases and
        the few constants of shapes and norms)."""
        return 4.0 * sum(int(np.prod(t.dims)) for t in self.inits)

    def _weight(self, shape: Sequence[int], fan_in: int) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(max(fan_in, 1)))

    def _act(self, x: str, fn: str, tag: str) -> str:
        shape = self.shapes[x]
        if not fn:
            return x
        if fn == "relu6":
            return self.node("Clip", [x, self.const(0.0), self.const(6.0)], tag, "act", shape)
        if fn == "swish":
            s = self.node("Sigmoid", [x], tag, "sig", shape)
            return self.node("Mul", [x, s], tag, "act", shape)
        if fn == "gelu" and self.erf_gelu:
            d = self.node("Div", [x, self.const(np.sqrt(2.0))], tag, "div", shape)
            e = self.node("Erf", [d], tag, "erf", shape)
            y = self.node("Mul", [x, self.node("Add", [e, self.const(1.0)], tag, "add", shape)], tag, "mul", shape)
            return self.node("Mul", [y, self.const(0.5)], tag, "act", shape)
        op = {"relu": "Relu", "hardswish": "HardSwish", "sigmoid": "Sigmoid", "hardsigmoid": "HardSigmoid",
              "gelu": "Gelu", "tanh": "Tanh", "leakyrelu": "LeakyRelu"}[fn]
        return self.node(op, [x], tag, "act", shape)

    # -- kernels on N, C, H, W tensors --
    def conv(self, x: str, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: str = "",
             pad: Optional[int] = None) -> str:
        tag = self._tag()
        _, cin, h, w = self.shapes[x]
        pad = k // 2 if pad is None else pad
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        weight = self._weight((cout, cin // groups, k, k), cin // groups * k * k)
        y = self.node("Conv", [x, weight, self.const(self.rng.standard_normal(cout) * 0.1)], tag, "conv",
                      (1, cout, oh, ow), kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
        self.macs += oh * ow * cout * (cin // groups) * k * k
        return self._act(y, act, tag)

    def conv_transpose(self, x: str, cout: int, k: int = 2, stride: int = 2) -> str:
        tag = self._tag()
        _, cin, h, w = self.shapes[x]
        weight = self._weight((cin, cout, k, k), cin * k * k)
        shape = (1, cout, (h - 1) * stride + k, (w - 1) * stride + k)
        self.macs += h * w * cin * cout * k * k
        return self.node("ConvTranspose", [x, weight, self.const(np.zeros(cout))], tag, "convt", shape,
                         kernel_shape=[k, k], strides=[stride, stride])

    def pool(self, x: str, kind: str, k: int = 2, stride: int = 2, pad: int = 0) -> str:
        tag = self._tag()
        n, c, h, w = self.shapes[x]
        shape = (n, c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
        op = "MaxPool" if kind == "max" else "AveragePool"
        return self.node(op, [x], tag, "pool", shape, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def global_pool(self, x: str) -> str:
        tag = self._tag()
        n, c = self.shapes[x][:2]
        return self.node("GlobalAveragePool", [x], tag, "gap", (n, c, 1, 1))

    def add(self, a: str, b: str) -> str:
        tag = self._tag()
        return self.node("Add", [a, b], tag, "add", self.shapes[a])

    def mul(self, a: str, b: str) -> str:
        tag = self._tag()
        return self.node("Mul", [a, b], tag, "mul", self.shapes[a])

    def act(self, x: str, fn: str) -> str:
        tag = self._tag()
        return self._act(x, fn, tag)

    def batch_norm(self, x: str) -> str:
        tag = self._tag()
        c = self.shapes[x][1]
        params = [self.const(v) for v in (np.ones(c), np.zeros(c), np.zeros(c), np.ones(c))]
        return self.node("BatchNormalization", [x, *params], tag, "bn", self.shapes[x])

    def concat(self, xs: Sequence[str], axis: int = 1) -> str:
        tag = self._tag()
        shape = list(self.shapes[xs[0]])
        shape[axis] = sum(self.shapes[x][axis] for x in xs)
        return self.node("Concat", list(xs), tag, "cat", tuple(shape), axis=axis)

    def split(self, x: str, parts: Sequence[int]) -> list[str]:
        from onnx import helper

        tag = self._tag()
        outs = [f"{tag}split{i}_{len(self.nodes)}" for i in range(len(parts))]
        self.nodes.append(helper.make_node("Split", [x, self.const(list(parts), np.int64)], outs,
                                           name=f"{tag}split_{len(self.nodes)}", axis=1))
        for name, c in zip(outs, parts):
            shape = list(self.shapes[x])
            shape[1] = c
            self.shapes[name] = tuple(shape)
        return outs

    # How exporters write upsampling (torch's `nn.Upsample`, TensorFlow's resize ops); the
    # coordinate mode decides whether onnxruntime runs a Resize in its blocked layout.
    RESIZE_MODES = {"nearest": {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                    "linear": {"coordinate_transformation_mode": "half_pixel"}}

    def resize(self, x: str, mode: str, scale: int = 2) -> str:
        tag = self._tag()
        n, c, h, w = self.shapes[x]
        scales = self.const([1.0, 1.0, float(scale), float(scale)])
        return self.node("Resize", [x, "", scales], tag, "resize", (n, c, h * scale, w * scale), mode=mode,
                         **self.RESIZE_MODES[mode])

    def reshape(self, x: str, shape: Sequence[int], tag: Optional[str] = None) -> str:
        tag = tag or self._tag()
        return self.node("Reshape", [x, self.const(list(shape), np.int64)], tag, "reshape", tuple(shape))

    def transpose(self, x: str, perm: Sequence[int], tag: Optional[str] = None) -> str:
        tag = tag or self._tag()
        shape = tuple(self.shapes[x][p] for p in perm)
        return self.node("Transpose", [x], tag, "transpose", shape, perm=list(perm))

    def channel_shuffle(self, x: str, groups: int = 2) -> str:
        n, c, h, w = self.shapes[x]
        y = self.reshape(x, (n, groups, c // groups, h, w))
        y = self.transpose(y, (0, 2, 1, 3, 4))
        return self.reshape(y, (n, c, h, w))

    # -- kernels on 1, T, C token tensors --
    def linear(self, x: str, cout: int, act: str = "") -> str:
        tag = self._tag()
        shape = self.shapes[x]
        cin = shape[-1]
        y = self.node("MatMul", [x, self._weight((cin, cout), cin)], tag, "mm", (*shape[:-1], cout))
        y = self.node("Add", [y, self.const(self.rng.standard_normal(cout) * 0.1)], tag, "bias", self.shapes[y])
        self.macs += int(np.prod(shape[:-1])) * cin * cout
        return self._act(y, act, tag)

    def classifier(self, x: str, classes: int) -> str:
        tag = self._tag()
        flat = self.node("Flatten", [x], tag, "flat", (1, int(np.prod(self.shapes[x][1:]))))
        cin = self.shapes[flat][1]
        self.macs += cin * classes
        return self.node("Gemm", [flat, self._weight((classes, cin), cin), self.const(np.zeros(classes))], tag, "fc",
                         (1, classes), transB=1)

    def layer_norm(self, x: str) -> str:
        tag = self._tag()
        c = self.shapes[x][-1]
        return self.node("LayerNormalization", [x, self.const(np.ones(c)), self.const(np.zeros(c))],
                         tag, "ln", self.shapes[x], axis=-1)

    def softmax(self, x: str) -> str:
        tag = self._tag()
        return self.node("Softmax", [x], tag, "softmax", self.shapes[x], axis=-1)

    def matmul(self, a: str, b: str) -> str:
        tag = self._tag()
        sa, sb = self.shapes[a], self.shapes[b]
        self.macs += int(np.prod(sa)) * sb[-1]
        return self.node("MatMul", [a, b], tag, "matmul", (*sa[:-1], sb[-1]))

    def scale(self, x: str, value: float) -> str:
        tag = self._tag()
        return self.node("Mul", [x, self.const(value)], tag, "scale", self.shapes[x])

    def spatial_mean(self, x: str) -> str:
        """x.mean((2, 3), keepdim=True), as timm's squeeze-excite writes global pooling."""
        tag = self._tag()
        n, c = self.shapes[x][:2]
        return self.node("ReduceMean", [x, self.const([2, 3], np.int64)], tag, "smean", (n, c, 1, 1), keepdims=1)

    def token_mean(self, x: str) -> str:
        tag = self._tag()
        n, t, c = self.shapes[x]
        return self.node("ReduceMean", [x, self.const([1], np.int64)], tag, "mean", (n, 1, c), keepdims=1)

    def reduce(self, x: str, op: str, axes: Sequence[int]) -> str:
        """A reduction (ReduceMean, ReduceL2, ...) of `axes`, dims kept."""
        tag = self._tag()
        shape = self.shapes[x]
        axes = [a % len(shape) for a in axes]
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
        return self.node(op, [x, self.const(axes, np.int64)], tag, op.lower(), out, keepdims=1)

    def elementwise(self, op: str, a: str, b: str) -> str:
        """Sub, Div, ... of two tensors, broadcast."""
        tag = self._tag()
        return self.node(op, [a, b], tag, op.lower(), tuple(np.broadcast_shapes(self.shapes[a], self.shapes[b])))

    def l2_normalize(self, x: str) -> str:
        """x / max(||x||, eps) over the last axis, as torch exports F.normalize: ReduceL2, Clip, Div."""
        n = self.reduce(x, "ReduceL2", [-1])
        tag = self._tag()
        n = self.node("Clip", [n, self.const(1e-12)], tag, "clip", self.shapes[n])
        return self.elementwise("Div", x, n)

    def model(self, output: str):
        """The ONNX model, with the shape of every tensor (so kernels can be cut out of it)."""
        from onnx import TensorProto, helper

        def info(name: str):
            return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(self.shapes[name]))

        inner = [info(o) for n in self.nodes for o in n.output if o != output]
        graph = helper.make_graph(self.nodes, "context", [info("input")], [info(output)], self.inits, value_info=inner)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="nasctl")
        model.ir_version = 10
        return model


# Channel counts real models use: multiples of 8 from width multipliers, and ShuffleNetV2's
# 116 / 244 / 488, whose halves (58, 122) are not multiples of 4.
WIDTHS = (8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 116, 120, 128, 144, 160, 176, 192, 200, 232, 240, 244,
          256, 288, 320, 384, 464, 480, 488, 512, 576, 640, 672, 768, 960, 1024)
SIZES = (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224)
CONV_ACTS = ("relu", "relu", "relu6", "hardswish", "swish", "", "gelu", "sigmoid")


def _pick(rng: np.random.Generator, values: Sequence, p=None):
    return values[int(rng.choice(len(values), p=p))]


def _width(rng: np.random.Generator, near: float) -> int:
    """A common channel count near `near`."""
    w = np.asarray(WIDTHS)
    idx = int(np.argmin(np.abs(np.log(w / max(near, 1.0)))))
    return int(w[int(np.clip(idx + rng.integers(-1, 2), 0, len(w) - 1))])


def _any_width(rng: np.random.Generator, near: float) -> int:
    """Any channel count within 30% of `near` (at least 6), most not a multiple of 4."""
    return int(max(6, round(near * float(np.exp(rng.uniform(-0.3, 0.3))))))


class _Blocks:
    """The blocks of the context networks (each appends its kernels to the builder)."""

    def __init__(self, b: NetBuilder, rng: np.random.Generator, budget: float = float("inf")):
        self.b, self.rng, self.budget = b, rng, budget  # budget: the network's MACs

    def ch(self, x: str) -> int:
        return self.b.shapes[x][1]

    def plain(self, x, cout, stride, act):
        k = _pick(self.rng, (1, 3, 3, 3, 5, 7))
        groups = _pick(self.rng, (1, 1, 1, 1, 2, 4, 8)) if k > 1 else 1
        if self.ch(x) % groups or cout % groups:
            groups = 1
        return self.b.conv(x, cout, k, stride, groups, act)

    def basic(self, x, cout, stride, act):
        b = self.b
        y = b.conv(b.conv(x, cout, 3, stride, act=act), cout, 3)
        short = x if stride == 1 and self.ch(x) == cout else b.conv(x, cout, 1, stride)
        return b.act(b.add(y, short), act or "relu")

    def bottleneck(self, x, cout, stride, act):
        b = self.b
        width = max(8, cout // 4)
        y = b.conv(b.conv(b.conv(x, width, 1, act=act), width, 3, stride, act=act), cout, 1)
        short = x if stride == 1 and self.ch(x) == cout else b.conv(x, cout, 1, stride)
        return b.act(b.add(y, short), act or "relu")

    def mbconv(self, x, cout, stride, act):
        b, rng = self.b, self.rng
        cin = self.ch(x)
        hidden = cin * _pick(rng, (1, 3, 4, 6, 6))
        k = _pick(rng, (3, 3, 5, 7))
        y = b.conv(x, hidden, 1, act=act) if hidden != cin else x
        y = b.conv(y, hidden, k, stride, groups=hidden, act=act)
        if rng.random() < 0.4:
            y = self.squeeze_excite(y)
        y = b.conv(y, cout, 1)
        return b.add(x, y) if stride == 1 and cin == cout else y

    def squeeze_excite(self, y, squeeze: Optional[int] = None):
        """y times a gate of its pooled channels (squeeze to `squeeze` channels, default a quarter)."""
        b, rng = self.b, self.rng
        c = self.ch(y)
        pooled = b.global_pool(y) if rng.random() < 0.5 else b.spatial_mean(y)
        gate = b.conv(b.conv(pooled, squeeze or max(8, c // 4), 1, act=_pick(rng, ("relu", "swish"))), c, 1,
                      act=_pick(rng, ("hardsigmoid", "sigmoid")))
        return b.mul(y, gate)

    def grouped(self, x, cout, stride, act, group_width: Optional[int] = None):
        """A ResNeXt / RegNet bottleneck: a grouped 3x3 conv of a fixed group width (drawn
        where not given), an optional squeeze-excite, a residual add."""
        b, rng = self.b, self.rng
        group_width = group_width or _pick(rng, (8, 16, 24, 32, 48, 64))
        width = max(group_width, -(-int(cout * _pick(rng, (0.5, 1.0))) // group_width) * group_width)
        y = b.conv(x, width, 1, act=act or "relu")
        y = b.conv(y, width, 3, stride, groups=width // group_width, act=act or "relu")
        if rng.random() < 0.4:
            y = self.squeeze_excite(y, max(8, self.ch(x) // 4))
        y = b.conv(y, cout, 1)
        short = x if stride == 1 and self.ch(x) == cout else b.conv(x, cout, 1, stride)
        return b.act(b.add(y, short), act or "relu")

    def separable(self, x, cout, stride, act):
        """A depthwise conv with a channel multiplier (each input channel to 2-4 outputs; 3x3
        to 7x7), optionally a depthwise conv of its output, then a 1x1 conv: FastViT's and
        MobileOne's downsampling, Xception-style separable convs with a depth multiplier.
        onnxruntime runs such a conv group by group, a kernel type of its own (`lut._depthwise`)."""
        b, rng = self.b, self.rng
        cin = self.ch(x)
        y = b.conv(x, cin * _pick(rng, (2, 2, 3, 4)), _pick(rng, (3, 5, 7, 7)), stride, groups=cin, act=act)
        if rng.random() < 0.4:
            y = b.conv(y, self.ch(y), 3, groups=self.ch(y), act=act)
        y = b.conv(y, cout, 1, act=act if rng.random() < 0.5 else "")
        return b.add(x, y) if stride == 1 and cin == cout else y

    def mixconv(self, x, cout, stride, act):
        """An inverted residual whose depthwise conv is split into channel groups with
        kernels 3, 5, 7 (9), concatenated (MixNet)."""
        b, rng = self.b, self.rng
        cin = self.ch(x)
        hidden = cin * _pick(rng, (3, 6))
        y = b.conv(x, hidden, 1, act=act)
        parts = int(rng.integers(2, 5))
        sizes = [hidden // parts] * (parts - 1) + [hidden - hidden // parts * (parts - 1)]
        y = b.concat([b.conv(p, c, 3 + 2 * i, stride, groups=c, act=act)
                      for i, (p, c) in enumerate(zip(b.split(y, sizes), sizes))])
        if rng.random() < 0.5:
            y = self.squeeze_excite(y)
        y = b.conv(y, cout, 1)
        return b.add(x, y) if stride == 1 and cin == cout else y

    def ghost(self, x, cout, stride, act):
        """Ghost modules: a primary 1x1 conv, a cheap depthwise conv of its output,
        concatenated; a depthwise stride conv between them where the block downsamples."""
        b = self.b

        def module(y, out, act):
            primary = b.conv(y, out // 2, 1, act=act)
            return b.concat([primary, b.conv(primary, out - out // 2, 3, groups=out // 2, act=act)])

        cin = self.ch(x)
        y = module(x, max(16, 2 * cout), act or "relu")
        if stride > 1:
            y = b.conv(y, self.ch(y), 3, stride, groups=self.ch(y))
        y = module(y, cout - cout % 2, "")
        short = x if stride == 1 and cin == self.ch(y) else b.conv(b.conv(x, cin, 3, stride, groups=cin),
                                                                   self.ch(y), 1)
        return b.add(y, short)

    def convnext(self, x, cout, stride, act):
        """A ConvNeXt block: depthwise 7x7, then channels last - layer norm, linear x4 with
        GELU, linear back, a layer-scale multiply - and back, a residual add."""
        b, rng = self.b, self.rng
        _, _, h, w = b.shapes[x]
        if h * w * cout * cout * 8 > self.budget:  # one block would take more than the network's budget
            return self.mbconv(x, cout, stride, act)
        if stride > 1 or self.ch(x) != cout:
            x = b.conv(x, cout, 2 if stride > 1 else 1, stride, pad=0)
        y = b.conv(x, cout, _pick(rng, (7, 7, 5, 3)), groups=cout)
        tag = b._tag()
        y = b.transpose(y, (0, 2, 3, 1), tag)
        y = b.linear(b.linear(b.layer_norm(y), cout * 4, act="gelu"), cout)
        y = b.scale(y, 1e-2) if rng.random() < 0.7 else y
        tag = b._tag()
        return b.add(x, b.transpose(y, (0, 3, 1, 2), tag))

    def fire(self, x, cout, stride, act):
        b = self.b
        if stride > 1:
            x = b.pool(x, "max", 3, 2, 1)
        s = b.conv(x, max(8, cout // 8), 1, act="relu")
        return b.concat([b.conv(s, cout // 2, 1, act="relu"), b.conv(s, cout - cout // 2, 3, act="relu")])

    def inception(self, x, cout, stride, act):
        """GoogLeNet's block: a 1x1 conv, a 1x1 then a 3x3, a 1x1 then a 3x3 or 5x5, and a
        3x3 max pool of stride 1 then a 1x1, concatenated (about a quarter of `cout` each);
        `stride` > 1 max-pools the input first."""
        b, rng = self.b, self.rng
        if stride > 1:
            x = b.pool(x, "max", 3, 2, 1)
        q = max(8, cout // 4)
        pooled = b.conv(b.pool(x, "max", 3, 1, 1), q, 1, act="relu")
        branches = [b.conv(x, q, 1, act="relu"),
                    b.conv(b.conv(x, max(8, q // 2), 1, act="relu"), q, 3, act="relu"),
                    b.conv(b.conv(x, max(8, q // 4), 1, act="relu"), max(8, cout - 3 * q), _pick(rng, (3, 5)),
                           act="relu")]
        return b.concat(branches + [pooled])

    def dense(self, x, cout, stride, act):
        b, rng = self.b, self.rng
        growth = _pick(rng, (8, 12, 16, 24, 32))
        for _ in range(int(rng.integers(1, 4))):
            y = b.act(b.batch_norm(x), "relu")
            y = b.conv(b.conv(y, 4 * growth, 1, act="relu"), growth, 3)
            x = b.concat([x, y])
        if stride > 1:
            x = b.pool(b.conv(b.act(b.batch_norm(x), "relu"), max(8, self.ch(x) // 2), 1), "avg", 2, 2)
        return x

    def shuffle(self, x, cout, stride, act):
        b = self.b
        cin = self.ch(x)
        half = max(8, cout // 2)
        if stride == 1 and cin % 2 == 0:
            left, right = b.split(x, [cin // 2, cin - cin // 2])
            r = b.conv(b.conv(b.conv(right, cin - cin // 2, 1, act="relu"), cin - cin // 2, 3,
                              groups=cin - cin // 2), cin - cin // 2, 1, act="relu")
            return b.channel_shuffle(b.concat([left, r]))
        left = b.conv(b.conv(x, cin, 3, 2, groups=cin), half, 1, act="relu")
        right = b.conv(b.conv(b.conv(x, half, 1, act="relu"), half, 3, 2, groups=half), half, 1, act="relu")
        return b.channel_shuffle(b.concat([left, right]))

    def mixer_conv(self, x, cout, stride, act):
        b, rng = self.b, self.rng
        if stride > 1 or self.ch(x) != cout:
            x = b.conv(x, cout, 1, stride)
        y = b.batch_norm(b.conv(x, cout, _pick(rng, (3, 5, 7)), groups=cout, act="gelu"))
        return b.batch_norm(b.conv(b.add(x, y), cout, 1, act="gelu"))

    # -- blocks of transposes and reductions that run without contiguous blocks --
    def channels_first_norm(self, x):
        """A layer norm over the channels of an N, C, H, W tensor written out with reductions
        over axis 1 (ConvNeXt's and EdgeNeXt's `channels_first` LayerNorm)."""
        b = self.b
        c = self.ch(x)
        d = b.elementwise("Sub", x, b.reduce(x, "ReduceMean", [1]))
        var = b.reduce(b.mul(d, d), "ReduceMean", [1])
        tag = b._tag()
        std = b.node("Sqrt", [b.node("Add", [var, b.const(1e-6)], tag, "eps", b.shapes[var])], tag, "sqrt",
                     b.shapes[var])
        y = b.elementwise("Div", d, std)
        return b.add(b.mul(y, b.const(np.ones((c, 1, 1)))), b.const(np.zeros((c, 1, 1))))

    def convnext_grn(self, x, cout, stride, act):
        """A ConvNeXt-V2 block: depthwise conv, channels last, layer norm, linear x4 with GELU,
        global response normalization (an L2 norm over the spatial axes, divided by its mean
        over the channels), linear back, channels first, a residual add."""
        b, rng = self.b, self.rng
        _, _, h, w = b.shapes[x]
        if h * w * cout * cout * 8 > self.budget:
            return self.mbconv(x, cout, stride, act)
        if stride > 1 or self.ch(x) != cout:
            x = self.channels_first_norm(x) if rng.random() < 0.5 else x
            x = b.conv(x, cout, 2 if stride > 1 else 1, stride, pad=0)
        y = b.conv(x, cout, _pick(rng, (7, 7, 5, 3)), groups=cout)
        tag = b._tag()
        y = b.linear(b.layer_norm(b.transpose(y, (0, 2, 3, 1), tag)), cout * 4, act="gelu")
        gx = b.reduce(y, "ReduceL2", [1, 2])
        mean = b.reduce(gx, "ReduceMean", [-1])
        tag = b._tag()
        nx = b.elementwise("Div", gx, b.node("Add", [mean, b.const(1e-6)], tag, "eps", b.shapes[mean]))
        y = b.add(b.add(b.mul(b.mul(y, nx), b.const(np.full(cout * 4, 0.1))), b.const(np.zeros(cout * 4))), y)
        y = b.linear(y, cout)
        tag = b._tag()
        return b.add(x, b.transpose(y, (0, 3, 1, 2), tag))

    def mobilevit(self, x, cout, stride, act):
        """A MobileViT block: a local conv, 1x1 to the transformer's width, 2x2 patches
        unfolded into 4 sequences of tokens (reshapes and transposes that move the innermost
        axis), a transformer MLP over them, folded back, 1x1 back, concatenated with the
        input and fused by a conv."""
        b, rng = self.b, self.rng
        if stride > 1 or self.ch(x) != cout:
            x = self.mbconv(x, cout, stride, act or "swish")
        _, c, h, w = b.shapes[x]
        if h % 2 or w % 2 or h < 4:
            return x
        d = _pick(rng, (32, 48, 64, 80, 96, 144))
        y = b.conv(b.conv(x, c, 3, act="swish"), d, 1)
        nh, nw, n = h // 2, w // 2, h * w // 4
        tag = b._tag()
        y = b.reshape(b.transpose(b.reshape(y, (d * nh, 2, nw, 2), tag), (0, 2, 1, 3), tag), (1, d, n, 4), tag)
        tag = b._tag()
        t = b.reshape(b.transpose(y, (0, 3, 2, 1), tag), (4, n, d), tag)
        for _ in range(int(rng.integers(1, 3))):
            t = b.add(t, b.linear(b.linear(b.layer_norm(t), 2 * d, act="swish"), d))
        t = b.layer_norm(t)
        tag = b._tag()
        y = b.transpose(b.reshape(t, (1, 4, n, d), tag), (0, 3, 2, 1), tag)
        tag = b._tag()
        y = b.reshape(b.transpose(b.reshape(y, (d * nh, nw, 2, 2), tag), (0, 2, 1, 3), tag), (1, d, h, w), tag)
        y = b.conv(y, c, 1, act="swish")
        return b.conv(b.concat([x, y]), cout, 3, act="swish")

    def cross_covariance(self, x, cout, stride, act):
        """EdgeNeXt's transposed attention (XCA) over an N, C, H, W tensor as tokens: queries
        and keys L2-normalized over the tokens (ReduceL2 over the innermost axis), a
        channels-by-channels attention, then an MLP; after a conv that resizes."""
        b, rng = self.b, self.rng
        if stride > 1 or self.ch(x) != cout:
            x = b.conv(x, cout, 2 if stride > 1 else 1, stride, pad=0)
        _, c, h, w = b.shapes[x]
        t = h * w
        heads = _pick(rng, tuple(k for k in (1, 2, 4, 8) if c % k == 0))
        d = c // heads
        tag = b._tag()
        tokens = b.transpose(b.reshape(x, (1, c, t), tag), (0, 2, 1), tag)
        y = b.layer_norm(tokens)

        def heads_of(z):
            tag = b._tag()
            return b.transpose(b.reshape(b.linear(z, c), (1, t, heads, d), tag), (0, 2, 3, 1), tag)

        q, k, v = b.l2_normalize(heads_of(y)), b.l2_normalize(heads_of(y)), heads_of(y)
        tag = b._tag()
        att = b.softmax(b.scale(b.matmul(q, b.transpose(k, (0, 1, 3, 2), tag)), 1.0))
        tag = b._tag()
        y = b.reshape(b.transpose(b.matmul(att, v), (0, 3, 1, 2), tag), (1, t, c), tag)
        tokens = b.add(tokens, b.linear(y, c))
        tokens = b.add(tokens, b.linear(b.linear(b.layer_norm(tokens), 4 * c, act="gelu"), c))
        tag = b._tag()
        return b.reshape(b.transpose(tokens, (0, 2, 1), tag), (1, c, h, w), tag)

    # -- token blocks --
    def attention(self, x):
        b, rng = self.b, self.rng
        _, t, c = b.shapes[x]
        heads = max(1, c // _pick(rng, (32, 64))) if c >= 64 else _pick(rng, tuple(h for h in (1, 2, 4) if c % h == 0))
        d = c // heads

        def split(y):
            tag = b._tag()
            return b.transpose(b.reshape(y, (1, t, heads, d), tag), (0, 2, 1, 3), tag)

        q, k, v = (split(b.linear(x, c)) for _ in range(3))
        tag = b._tag()
        kt = b.transpose(k, (0, 1, 3, 2), tag)
        att = b.softmax(b.scale(b.matmul(q, kt), d ** -0.5))
        y = b.matmul(att, v)
        tag = b._tag()
        y = b.reshape(b.transpose(y, (0, 2, 1, 3), tag), (1, t, c), tag)
        return b.linear(y, c)

    def transformer(self, x, mixer: bool):
        b, rng = self.b, self.rng
        _, t, c = b.shapes[x]
        if mixer:
            tag = b._tag()
            y = b.transpose(b.layer_norm(x), (0, 2, 1), tag)
            y = b.linear(b.linear(y, max(8, c // 2), act="gelu"), t)
            tag = b._tag()
            x = b.add(x, b.transpose(y, (0, 2, 1), tag))
        else:
            x = b.add(x, self.attention(b.layer_norm(x)))
        side = int(round(np.sqrt(t)))
        if side * side == t and not mixer and rng.random() < 0.3:  # a token grid: PVT-v2's conv MLP
            hidden = c * _pick(rng, (2, 4, 8))
            y = b.linear(b.layer_norm(x), hidden)
            tag = b._tag()
            y = b.reshape(b.transpose(y, (0, 2, 1), tag), (1, hidden, side, side), tag)
            y = b.conv(y, hidden, 3, groups=hidden)
            tag = b._tag()
            y = b.transpose(b.reshape(y, (1, hidden, t), tag), (0, 2, 1), tag)
            y = b.linear(b.act(y, _pick(rng, ("gelu", "gelu", "swish", "hardswish", "relu"))), c)
        else:
            y = b.linear(b.linear(b.layer_norm(x), c * _pick(rng, (2, 4)), act="gelu"), c)
        return b.add(x, y)


def random_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 1e6,
                   erf_gelu: bool = False):
    """A random context network (an onnx.ModelProto) and a short description of it, of
    `min_macs` to `max_macs` multiply-accumulates (a tiny one below `min_macs` 1e6 only).
    With `erf_gelu`, half the int8 transformers write their GELUs as torch exports them
    before opset 20 (`NetBuilder.erf_gelu`): quantized, onnxruntime runs the Erf and the
    products and sums around it one by one, as it does in published int8 transformers."""
    family = _pick(rng, ("cnn", "cnn", "cnn", "cnn", "int8", "int8", "transformer", "unet", "tiny", "regnet"))
    if family == "tiny":
        if min_macs <= 1e6:
            return _tiny_net(rng, min(max_macs, 2e6))
        family = "cnn"
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    size = _pick(rng, SIZES)
    if family == "transformer":
        return _transformer_net(rng, size, budget)
    if family == "unet":
        return _unet_net(rng, size, budget)
    if family == "regnet":
        model, description = _regnet_net(rng, size, budget)
        if rng.random() < 1 / 3:
            return _int8(model, description, rng, per_channel=bool(rng.random() < 0.5))
        return model, description
    if family == "int8":
        per_channel = bool(rng.random() < 0.5)  # the quantizer's two weight modes
        model, description = (_transformer_net(rng, size, budget, erf_gelu=erf_gelu and rng.random() < 0.5)
                              if rng.random() < 0.2 else _cnn_net(rng, size, budget, int8=True))
        return _int8(model, description, rng, per_channel)
    return _cnn_net(rng, size, budget)


def _int8(model, description: str, rng: np.random.Generator, per_channel: bool):
    """The network quantized (`quantize`) and its description saying so."""
    return quantize(model, rng, per_channel=per_channel), f"int8{' per-channel' * per_channel} {description}"


TINY_SIZES = (8, 12, 16)  # digits-sized inputs, what small search candidates see


def _tiny_net(rng, max_macs: float):
    """A small network on a small input (8-16 px, one or three channels), a conv net or a
    vision transformer over 4-64 tokens of 16-64 channels: kernels whose fixed cost is
    most of their time, as in the candidates a search trains on small images."""
    budget = float(np.exp(rng.uniform(np.log(1e4), np.log(max_macs))))
    size, channels = _pick(rng, TINY_SIZES), _pick(rng, (1, 3))
    if rng.random() < 0.5:
        model, description = _transformer_net(rng, size, budget, channels=channels, dims=(16, 24, 32, 48, 64),
                                              conv_stem=rng.random() < 0.3)
    else:
        int8 = bool(rng.random() < 0.3)
        model, description = _cnn_net(rng, size, budget, int8=int8, channels=channels, widths=(8, 16, 24, 32))
        if int8:
            return quantize(model, rng, per_channel=bool(rng.random() < 0.5)), f"int8 tiny {description}"
    return model, f"tiny {description}"


def odd_width_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 1e6):
    """A conv net whose channel counts are any integers (`_any_width`), not the multiples
    of 8 of width multipliers: the channels of ReXNet (162, 366, ... 906), ShuffleNetV2's
    halves (58) and split or ghost blocks.  onnxruntime runs a depthwise conv of channels
    not a multiple of 4 one channel at a time (`lut._plain_depthwise`), at every size; the
    other context networks hold few."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    model, description = _cnn_net(rng, _pick(rng, SIZES), budget, width=_any_width)
    return model, f"odd-width {description}"


NARROW_SIZES = (128, 160, 192, 224, 256)  # the inputs narrow networks see


def narrow_network(rng: np.random.Generator, max_macs: float = 4e7, min_macs: float = 8e6):
    """A conv net of a small width multiplier: an 8-channel stem (sometimes 12) at 128-256
    px, widening from there - LCNet-0.5's, MobileNetV3-small-0.5's and RepGhostNet-0.5's
    first layers, an 8-channel conv and depthwise conv at 112x112, which onnxruntime runs
    padded to a whole vector block.  The other context networks start at 12 channels or
    more, and price those layers at 0.6-0.7x their time.  Of 8-40 MMAC: about as many
    kernels as the other networks (of 20-150 MMAC, twice as many, they took the place of
    one in six of the others in a profile of a given number of kernels)."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    size = _pick(rng, NARROW_SIZES)
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng, budget)
    act = _pick(rng, ("hardswish", "hardswish", "relu", "relu6", "swish", ""))
    stem = _pick(rng, (8, 8, 12))
    x = b.conv("input", stem, 3, 2, act=act or "relu")
    # a depthwise conv of the stem's channels at its size, then a pointwise one (LCNet's first block)
    x = b.conv(x, stem, _pick(rng, (3, 3, 5)), _pick(rng, (1, 1, 2)), groups=stem, act=act)
    x = b.conv(x, _pick(rng, (8, 16, 16, 24)), 1, act=act)
    kinds = ("mbconv", "ghost", "shuffle", "plain", "basic", "mixconv")
    x, used = _stages(blocks, x, act, lambda last: _pick(rng, kinds), _width, repeats=2)
    y = b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000)))
    return b.model(y), f"narrow {'/'.join(dict.fromkeys(used)) or 'plain'} {size}px"


MOBILE_SIZES = (160, 192, 224, 256)  # the inputs mobile networks see


def mobile_network(rng: np.random.Generator, max_macs: float = 1.5e8, min_macs: float = 2e7):
    """A mobile conv net as published ones begin: a stride-2 stem at 160-256 px, then a first
    block at the stem's resolution with stride 1 - a depthwise conv of 16-48 channels at
    80-128 px and a pointwise one (the first blocks of MobileNetV1/V2, MnasNet and
    EfficientNet) - then inverted-residual stages.
    Half of them int8, quantized as users quantize models for onnxruntime: it runs some of
    their depthwise convs as QLinearConv and others, unfused, in its plain float conv
    between dequantize and quantize nodes (`conv_dw_w8a8_dq`), at 5-10x the time of a
    blocked float one (int8 MobileNetV2's).  Their activations are published mobile nets'
    in int8 too: a hardswish or a swish (LCNet, MobileNetV3, EfficientNet) runs apart from
    an int8 conv, in float
    between dequantize and quantize nodes, where the other int8 context networks' relus
    fold into the conv's output range (int8 LCNet's 1x1 convs with a hardswish were priced
    at a seventh of their time).  The other context networks' first blocks have stride 2,
    so their depthwise convs of stride 1 start at a quarter of their input's size, and
    their int8 ones of that kind stopped at 24 px in a full profile (int8 MobileNetV2's of
    112 px were priced from strided ones, about twice their time).  Of 20-150 MMAC."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    size = _pick(rng, MOBILE_SIZES)
    int8 = bool(rng.random() < 0.5)
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng, budget)
    act = _pick(rng, ("relu", "relu6", "hardswish", "swish"))
    stem = _pick(rng, (16, 24, 32, 32, 40, 48))
    x = b.conv("input", stem, 3, 2, act=act)
    # the first block: a depthwise conv at the stem's size, a squeeze-excite a third of the
    # time (EfficientNet's), a pointwise conv; without an expansion, as in all four
    y = b.conv(x, stem, _pick(rng, (3, 3, 5)), 1, groups=stem, act=act)
    if rng.random() < 1 / 3:
        y = blocks.squeeze_excite(y)
    x = b.conv(y, _pick(rng, (16, 16, 24, 32)), 1, act=_pick(rng, (act, "")))
    kinds = ("mbconv", "mbconv", "mbconv", "ghost", "mixconv")
    x, used = _stages(blocks, x, act, lambda _: _pick(rng, kinds), _width, repeats=3)
    if rng.random() < 0.5:
        x = b.conv(x, _width(rng, 4 * blocks.ch(x)), 1, act=act)
    model = b.model(b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000))))
    description = f"mobile {'/'.join(dict.fromkeys(used)) or 'mbconv'} {size}px"
    if int8:
        return _int8(model, description, rng, per_channel=bool(rng.random() < 0.5))
    return model, description


def multiplier_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 1e6):
    """A conv net whose stages are mostly `separable` blocks: depthwise convs with a channel
    multiplier (FastViT, MobileOne, Xception), which onnxruntime runs group by group, one
    input channel a group (`lut.kernel_type` `conv_mult`); the other context networks hold
    none.  A third of them int8."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    int8 = bool(rng.random() < 1 / 3)
    model, description = _cnn_net(rng, _pick(rng, SIZES), budget, int8=int8,
                                  kinds=("separable", "separable", "separable", "separable", "mbconv", "basic"))
    if int8:
        return _int8(model, f"multiplier {description}", rng, per_channel=bool(rng.random() < 0.5))
    return model, f"multiplier {description}"


HEADED_WEIGHTS = (2e6, 4e7)  # the weight bytes a headed network is drawn to hold (log-uniform)


def headed_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 1e6):
    """A conv net whose head holds most of its weights, as in small published models
    (MobileNetV3's 576->1024->1000 and RepGhostNet's 1280->1000 after a few MB of convs):
    global pooling, a linear layer to a hidden width, an activation and a 100- or
    1000-class classifier, the hidden width drawn so that the network holds about 2-40 MB
    of weights (`HEADED_WEIGHTS`, log-uniform; the width kept within 64-8192, so a head on
    narrow features or after a large backbone misses it).  Such layers read their weights
    once per run, from the caches or from memory by the model's weight bytes
    (`lut.WeightStream`); the other context networks place few of them at 5-20 MB, where
    that changes."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    target = float(np.exp(rng.uniform(*np.log(HEADED_WEIGHTS))))

    def head(b: NetBuilder, x: str) -> str:
        c, classes = b.shapes[x][1], _pick(rng, (100, 1000, 1000))
        left = max(target - b.weight_bytes(), 0.0)
        hidden = int(np.clip(round(left / 4 / (c + classes) / 8) * 8, 64, 8192))
        y = b.classifier(b.global_pool(x), hidden)
        fn = _pick(rng, ("hardswish", "relu", "gelu", ""))
        return b.classifier(b.act(y, fn) if fn else y, classes)

    model, description = _cnn_net(rng, _pick(rng, SIZES), budget, head=head)
    return model, f"headed {description}"


def strided_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 1e6):
    """A conv net with the blocks of hybrid models whose transposes and reductions run
    without contiguous blocks (`layers.STRIDED`): MobileViT's patch unfolding, ConvNeXt-V2's
    global response normalization (L2 norms over the spatial axes), EdgeNeXt's
    L2-normalized transposed attention and layer norms over the channels axis; the other
    context networks hold few of them, and none at large sizes."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    size = _pick(rng, SIZES)
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng, budget)
    kinds = ("mobilevit", "convnext_grn", "cross_covariance", "mbconv", "convnext")
    act = _pick(rng, ("swish", "gelu", "relu"))
    width = _width(rng, _pick(rng, (16, 24, 32, 48)))
    k = _pick(rng, (3, 4))
    x = b.conv("input", width, k, 2 if size >= 64 else 1, act=act, pad=(k - 1) // 2)
    if rng.random() < 0.3:
        x = blocks.channels_first_norm(x)
    x, used = _stages(blocks, x, act, lambda _: _pick(rng, kinds), _width, repeats=2, at_least_one=True)
    y = b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000)))
    return b.model(y), f"strided {'/'.join(dict.fromkeys(used))} {size}px"


WIDE_SIZES = (32, 40, 48, 56, 64)  # the inputs wide networks see: their stages start at 8-16 px
WIDE_INNER = (64, 96, 128)  # the width of a wide network's first stage (of a bottleneck's 3x3 conv)


def wide_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 2e7):
    """A residual conv net of wide dense convs, as ResNets and VGG-style nets are: a stem,
    then stages of stride 2 of basic or bottleneck blocks whose 3x3 convs start at 64-128
    channels and 8-16 px and double each stage up to 512 (a bottleneck's 1x1 convs four
    times that).  Two thirds of them int8: onnxruntime runs some of their dense convs as
    QLinearConv and others, unfused, in its plain (channels-first) float conv between
    dequantize and quantize nodes (`conv_w8a8_dq`), at 1.2-1.4x the blocked float conv's
    time on ResNet-18's maps (64-256 channels at 14-56 px) and 1.3-2.0x for 32-48 channels,
    or 256-512 at 7 px and less, whose many weights are dequantized at every run
    (`benchmarks/dequantized.py`).  The other context networks' int8 dense 3x3 convs have
    72 channels or fewer but for a few, and int8 ResNets' were priced from them at
    1.3-1.7x the float price.  Drawn to 20-100 MMAC (the last block may pass it), so that
    their kernels are rows of the table (a large network's are not)."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    size = _pick(rng, WIDE_SIZES)
    int8 = bool(rng.random() < 2 / 3)
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng, budget)
    act = _pick(rng, ("relu", "relu", "relu6"))
    kind = _pick(rng, ("basic", "bottleneck"))
    x = b.conv("input", _pick(rng, (32, 48, 64)), _pick(rng, (3, 7)), 2, act=act)
    inner = _pick(rng, WIDE_INNER)
    while b.macs < budget and b.shapes[x][2] >= 4 and b.kernels < 120:
        cout = inner * (4 if kind == "bottleneck" else 1)
        for i in range(int(rng.integers(1, 3))):
            x = getattr(blocks, kind)(x, cout, 2 if i == 0 else 1, act)
            if b.macs >= budget:
                break
        inner = min(2 * inner, 512)
    model = b.model(b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000))))
    description = f"wide {kind} {size}px"
    if int8:
        return _int8(model, description, rng, per_channel=bool(rng.random() < 0.5))
    return model, description


JOINED_SIZES = (64, 96, 112, 128, 160, 192, 224)  # the inputs joined networks see


def joined_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 2e7):
    """An int8 conv net whose stages end in a join - fire modules' or inception blocks'
    concatenations, or residual sums - and a max pool on it, as SqueezeNet's and
    GoogLeNet's do: onnxruntime runs an 8-bit max pool whose input a QLinearConcat or a
    QLinearAdd writes in its plain channels-first kernel (`layers.MAX_NCHW`), about 30x the
    time per element of its channels-last pool.  The other context networks hold few (a
    fire block of stride 2 after another), and one full profile drew none: the int8
    SqueezeNet-1.1's two such pools were priced at a fortieth of their time, from
    channels-last rows.  A stem conv of stride 2 and a max pool, then stages of one or two
    blocks of one kind, each stage ending in a max pool of stride 2.  (onnxruntime runs an
    int8 inception net's pools, its blocks' own of stride 1 too, on dequantized values: a
    sixth of them are such.)  Of 20-100 MMAC, weights per tensor or per channel."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    kind = _pick(rng, ("fire", "fire", "fire", "basic", "basic", "inception"))
    # a residual block's 3x3 convs take all its channels: its stages start at 28 px or less
    size = _pick(rng, JOINED_SIZES if kind != "basic" else JOINED_SIZES[:4])
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng, budget)
    x = b.conv("input", _pick(rng, (32, 48, 64)), _pick(rng, (3, 3, 7)) if size <= 128 else 3, 2, act="relu")
    x = b.pool(x, "max", 3, 2)
    cout = _width(rng, _pick(rng, (1.0, 2.0)) * blocks.ch(x)) if kind != "basic" else blocks.ch(x)
    first = True
    while (first or b.macs < budget) and b.shapes[x][2] >= 6 and b.kernels < 120:
        first = False
        for _ in range(int(rng.integers(1, 3))):
            x = getattr(blocks, kind)(x, cout, 1, "relu")
        k = _pick(rng, (2, 3, 3))
        x = b.pool(x, "max", k, 2, _pick(rng, (0, 1)) if k == 3 else 0)
        cout = min(_width(rng, cout * _pick(rng, (1.5, 2.0))), 512)
    model = b.model(b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000))))
    return _int8(model, f"joined {kind} {size}px", rng, per_channel=bool(rng.random() < 0.5))


def grouped_network(rng: np.random.Generator, max_macs: float = 1e8, min_macs: float = 2e7):
    """An int8 RegNet (`_regnet_net`): grouped convs of tens of groups of 8-24 channels at
    every resolution, which onnxruntime runs, quantized, either fused (QLinearConv) or
    unfused, group by group in its plain float conv between dequantize and quantize nodes
    (`conv_g_w8a8_dq`).  Random networks draw few int8 grouped convs (one full profile held
    five unfused rows, of 2-9 groups), and the int8 RegNetX-200MF's unfused ones (3-46
    groups) were priced at 0.58x their time.  Drawn to 20-100 MMAC (the last block may pass
    it), weights per tensor or per channel."""
    budget = float(np.exp(rng.uniform(np.log(min_macs), np.log(max_macs))))
    model, description = _regnet_net(rng, _pick(rng, SIZES), budget)
    return _int8(model, f"grouped {description}", rng, per_channel=bool(rng.random() < 0.5))


def _stages(blocks: _Blocks, x: str, act: str, next_kind, width_of, repeats: int, at_least_one: bool = False):
    """Stages of blocks until the network's MACs reach its budget (or its maps 4 px, or 120
    kernels): each of `next_kind(the last kind)`, widening by 1-2x (`width_of(rng, near)`),
    of 1 to `repeats` blocks, the first with stride 2.  The output and the kinds used."""
    b, rng = blocks.b, blocks.rng
    width, used = blocks.ch(x), []
    while (b.macs < blocks.budget or (at_least_one and not used)) and b.shapes[x][2] >= 4 and b.kernels < 120:
        kind = next_kind(used[-1] if used else None)
        used.append(kind)
        cout = width_of(rng, width * _pick(rng, (1.0, 1.5, 2.0)))
        for i in range(int(rng.integers(1, repeats + 1))):
            x = getattr(blocks, kind)(x, cout, 2 if i == 0 and b.shapes[x][2] >= 8 else 1, act)
            if b.macs >= blocks.budget:
                break
        width = blocks.ch(x)
    return x, used


def _cnn_net(rng, size, budget, int8: bool = False, channels: int = 3, widths=(16, 24, 32, 48, 64), width=_width,
             head: Optional[Callable[[NetBuilder, str], str]] = None, kinds: Optional[Sequence[str]] = None):
    """A conv net; with `int8`, one to be quantized: its activations are those static
    quantization folds into a kernel's output range (others would run apart, in float
    between quantization pairs, inside one kernel's tag).  `width(rng, near)` draws its
    channel counts; `head(builder, features)` writes its head (a classifier by default);
    `kinds`: the blocks its stages are drawn from (by default all but `separable`)."""
    b = NetBuilder(rng, (1, channels, size, size))
    blocks = _Blocks(b, rng, budget)
    kinds = tuple(kinds) if kinds else ("plain", "basic", "bottleneck", "mbconv", "fire", "dense", "shuffle",
                                        "grouped", "mixconv", "ghost") + (() if int8 else ("mixer_conv", "convnext"))
    kind = _pick(rng, kinds)
    act = _pick(rng, ("relu", "relu6", "") if int8 else CONV_ACTS[:-2])
    width_of, width = width, width(rng, _pick(rng, widths))
    stride = 2 if size >= 96 or rng.random() < 0.3 else 1
    x = b.conv("input", width, _pick(rng, (3, 3, 5, 7)) if kind != "mixer_conv" else 1, stride, act=act or "relu")
    if size >= 112 and rng.random() < 0.5:
        x = b.pool(x, "max", 3, 2, 1)
    x, used = _stages(blocks, x, act, lambda last: _pick(rng, kinds) if rng.random() < 0.3 else last or kind,
                      width_of, repeats=3)
    kind, width = (used[-1] if used else kind), blocks.ch(x)
    if rng.random() < 0.3:
        x = b.conv(x, width_of(rng, 4 * width), 1, act=act or "relu")
    if head is not None:
        y = head(b, x)
    elif rng.random() < 0.2:
        y = b.global_pool(b.conv(x, _pick(rng, (10, 100, 1000)), 1, act="relu"))
    else:
        y = b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000)))
    return b.model(y), f"{kind} {size}px"


def _regnet_net(rng, size, budget):
    """A RegNet: stages of grouped bottlenecks of one small group width, widening 1.5-2.5x a
    stage - grouped convs of tens to hundreds of groups of 8-24 channels, at every
    resolution, which conv nets of other blocks seldom reach (onnxruntime runs such a conv
    group by group: its time follows its groups and pixels more than its MACs)."""
    b = NetBuilder(rng, (1, 3, size, size))
    blocks = _Blocks(b, rng, budget)
    act = _pick(rng, ("relu", "relu", "swish", "hardswish"))
    group_width = _pick(rng, (8, 8, 16, 24))
    width = _pick(rng, (16, 24, 32, 48))
    x = b.conv("input", width, 3, 2, act=act)
    while b.macs < budget and b.shapes[x][2] >= 4 and b.kernels < 120:
        cout = max(group_width, int(round(width * _pick(rng, (1.5, 2.0, 2.5)) / group_width)) * group_width)
        for i in range(int(rng.integers(1, 4))):
            x = blocks.grouped(x, cout, 2 if i == 0 and b.shapes[x][2] >= 8 else 1, act, group_width)
            if b.macs >= budget:
                break
        width = blocks.ch(x)
    return b.model(b.classifier(b.global_pool(x), _pick(rng, (10, 100, 1000)))), f"regnet gw{group_width} {size}px"


def _transformer_net(rng, size, budget, channels: int = 3, dims=None, conv_stem: bool = False,
                     erf_gelu: bool = False):
    b = NetBuilder(rng, (1, channels, size, size))
    b.erf_gelu = erf_gelu
    blocks = _Blocks(b, rng)
    patch = _pick(rng, tuple(p for p in (2, 4, 8, 16) if size % p == 0 and size // p >= 2
                             and (size // p) ** 2 <= 1600 and (size // p >= 4 or size <= 16)) or (size // 4,))
    tokens = (size // patch) ** 2
    if dims is None:
        if tokens > 400:  # the first stages of hierarchical transformers (PVT, EdgeNeXt): many narrow tokens
            dims = (32, 48, 64)
        else:  # wide ones only over few tokens
            dims = (64, 96, 128, 192, 256, 384) + ((512, 768) if tokens <= 100 else ())
    dim = _pick(rng, dims)
    mixer = rng.random() < 0.3
    x = "input"
    if conv_stem:  # a hybrid: a small conv before the patches
        x = b.conv(x, _pick(rng, (8, 16)), 3, act="relu")
    x = b.conv(x, dim, patch, patch, pad=0)
    g = b.shapes[x][2]
    tag = b._tag()
    x = b.transpose(b.reshape(x, (1, dim, g * g), tag), (0, 2, 1), tag)
    if not mixer:
        if rng.random() < 0.5:  # a class token (ViT, DeiT); without one the tokens stay a grid
            x = b.concat([b.const(rng.standard_normal((1, 1, dim)) * 0.02), x], axis=1)
        x = b.add(x, b.const(rng.standard_normal(b.shapes[x]) * 0.02))
    for _ in range(int(rng.integers(1, 9))):
        x = blocks.transformer(x, mixer)
        if b.macs >= budget:
            break
    x = b.layer_norm(x)
    x = b.token_mean(x) if mixer or rng.random() < 0.5 else b.reshape(x, (1, b.shapes[x][1] * dim))
    kind = "mixer" if mixer else "vit"
    return b.model(b.classifier(x, _pick(rng, (10, 100, 1000)))), f"{kind} {size}px" + " erf-gelu" * erf_gelu


def _unet_net(rng, size, budget):
    channels = _pick(rng, (1, 3))
    b = NetBuilder(rng, (1, channels, size, size))
    up = _pick(rng, ("nearest", "linear", "transpose"))
    width = _pick(rng, (8, 16, 32))
    levels = int(rng.integers(2, 5))
    x, skips = "input", []
    for i in range(levels):
        if i:
            x = b.pool(x, "max", 2, 2)
        x = b.conv(b.conv(x, width << i, 3, act="relu"), width << i, 3, act="relu")
        skips.append(x)
    for i in reversed(range(levels - 1)):
        x = b.conv_transpose(x, b.shapes[x][1]) if up == "transpose" else b.resize(x, up)
        x = b.concat([x, skips[i]])
        x = b.conv(b.conv(x, width << i, 3, act="relu"), width << i, 3, act="relu")
    return b.model(b.conv(x, _pick(rng, (1, 2, 4)), 1)), f"unet-{up} {size}px"


def quantize_int8(src: Path, dst: Path, inputs: Sequence[dict], per_channel: bool = False) -> None:
    """onnxruntime's static quantization of the ONNX model `src` into `dst`: QDQ format, int8
    weights and activations, weights per tensor or `per_channel`, calibrated on `inputs`
    (feeds)."""
    import logging

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    feeds = iter(inputs)

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    logging.disable(logging.WARNING)  # the quantizer's advice goes to the root logger
    try:
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=per_channel)
    finally:
        logging.disable(logging.NOTSET)


def quantize(model, rng: np.random.Generator, samples: int = 2, per_channel: bool = False):
    """The int8 network onnxruntime's static quantizer (`quantize_int8`) makes of a float
    context network - as users quantize models for onnxruntime - calibrated on random
    inputs.  A node the quantizer adds without a kernel's tag (the dequantization of a
    weight or of the input) takes the tag of the kernel it feeds."""
    import onnx

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    with tempfile.TemporaryDirectory(prefix="nasctl-int8-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(model.SerializeToString())
        quantize_int8(src, dst, [{"input": rng.standard_normal(shape).astype(np.float32)} for _ in range(samples)],
                      per_channel=per_channel)
        quantized = onnx.shape_inference.infer_shapes(onnx.load(str(dst)))  # kernels are cut out by shape
    consumers: dict[str, list] = {}
    for n in quantized.graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    for n in reversed(quantized.graph.node):  # consumers come later in a graph: tag them first
        if TAG.search(n.name) is None:
            tags = [m.group(0) for c in consumers.get(n.output[0], []) if (m := TAG.search(c.name))]
            if tags:
                n.name = tags[0] + n.name
    return quantized
