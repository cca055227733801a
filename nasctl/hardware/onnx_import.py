"""Import an ONNX model as the `LayerSpec`s a cost model prices.

The model is parsed once (refused if its IR version or opset is newer than the installed
onnx knows), the values of its large weights dropped (only their shapes and types are
read), its input shapes fixed (a dynamic dimension needs a shape from the caller, who may
set only dynamic dims, and a static batch to 1), and its tensor shapes found by ONNX shape
inference (strict mode; where that fails, lenient mode, and the failure is noted).  Shape
computations inference cannot follow are folded to constants (rules here for the common
ops, onnx's reference implementation for the others) and inference runs again; tensors
still without a static shape get theirs from one run of the model with onnxruntime on a
random input (noted), so that no layer is left unpriced for want of a shape.  A conv whose
weight does not take its input's channels, or a matrix product whose inner dimensions
differ, is refused naming the node: such a model cannot run.
Then every node goes, in graph order, to the handler its op type names in a table
(`HANDLERS`, which callers may extend or override:
`import_onnx(path, handlers={**HANDLERS, "TopK": my_handler})`).  A handler returns the
node's layers (none for pure shape ops), or None when it cannot price the node.  A node
without a handler, or one its handler refuses, is counted in `ImportResult.unsupported`
- never dropped silently.

What runtimes fuse is fused here too:
  - batch norm after a conv (or linear) is folded into it, and so is a bias `Add`; either
    gives the layer a bias (`LayerSpec.bias`), as does a Conv's bias input or a Gemm's
    constant C.  A MatMul has no bias of its own: only a constant Add folded into it;
  - a Mul of a float conv's output by a constant scalar or one constant per channel (a
    layer scale) is folded into the conv, as onnxruntime folds it into the weights;
  - an activation right after a conv or linear becomes its `fn` (no layer of its own);
  - a float Mul (or Div) by a constant scalar on the output or an input of a product of two
    activations (attention scores scaled by 1/sqrt(d)) is folded into the product, as
    onnxruntime runs it (FusedMatMul);
  - multi-node patterns become one node before the handlers see them (`PATTERNS`):
    Erf-based GELU (Div/Erf/Add/Mul/Mul), HardSwish as HardSigmoid*x or x*Clip(x+3)/6,
    Swish as x*Sigmoid(x), and layer norm spelled ReduceMean/Sub/Pow/ReduceMean/Add/
    Sqrt/Div(/Mul/Add) (fn `LAYER_OPS` where it reduces over an axis other than the
    innermost, which onnxruntime does not fuse).
  - Nodes that compute only on constants (weights, shapes) cost nothing: runtimes fold
    them when they load the model.  QuantizeLinear/DequantizeLinear cost nothing either:
    they set the bit widths of the layers they feed.  But onnxruntime folds no
    DequantizeLinear, so a node computed from a dequantized constant that its optimized
    graph still runs (an int8 LeViT's attention biases, gathered from their table) is
    priced as a layer (`_constants`).
  - A quantized (QDQ) layer that onnxruntime does not fuse into an integer kernel is marked
    `dequantized`: read from the graph onnxruntime optimizes the model into, where it can
    load it, else from the graph's structure as its QDQ selectors read it.  A max pool or
    resize counts as fused where its QDQ nodes are dropped and it runs on the 8-bit values;
    an 8-bit max pool onnxruntime runs in its plain channels-first kernel, not converted to
    the channels-last NhwcMaxPool, gets fn `max_nchw` (read from the fully optimized graph).

Tensors map to layers as channels x (H, W): rank 4 and up is NCHW (further dims folded
into W), rank 3 and below is channels-last, [B, T, C] -> C x (T, 1).  Every input must
have batch 1; a leading dim other than 1 inside the graph is folded into the positions,
so element counts stay exact.  Bit widths come from the tensor type, or, for a tensor
that comes out of a DequantizeLinear, from its zero point's type (int8/uint8 -> 8,
int4/uint4 -> 4, int16 -> 16).

Early exits, as `nasctl export` writes them (nested If nodes, one per exit, named
exit_<name>, whose then-branch passes the exit head's logits on and whose else-branch runs
the rest of the network), are imported branch nodes and all: each layer's `segment` is the
number of else-branches it is nested in, exit heads get role "exit", the nodes deciding
whether to exit are not priced (noted), and `ImportResult.exits` names the exits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from math import prod
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..errors import UsageError
from .layout import BLOCKS, Reorder, reorders
from .layers import (LAYER_OPS, MAX_NCHW, SKIP, STRIDED, SUM, WHOLE_BLOCK, LayerSpec, chw, reduction_is_strided,
                     transpose_fn, transpose_view)

Shape = tuple[int, ...]

_BITS = {getattr(TensorProto, name): bits for name, bits in [
    ("FLOAT", 32), ("DOUBLE", 64), ("FLOAT16", 16), ("BFLOAT16", 16), ("INT32", 32), ("UINT32", 32),
    ("INT16", 16), ("UINT16", 16), ("INT8", 8), ("UINT8", 8), ("INT4", 4), ("UINT4", 4), ("INT2", 2),
    ("UINT2", 2), ("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
    ("FLOAT4E2M1", 4)] if hasattr(TensorProto, name)}

# Layers that absorb a following batch norm, bias add or activation.
_FUSES_INTO = ("conv", "conv_transpose", "linear")
# Ops through which a tensor keeps its values (and so its quantization).
_SAME_VALUES = frozenset({"DequantizeLinear", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
# Ops between a layer and what it fuses with that runtimes remove.
_SEE_THROUGH = frozenset({"QuantizeLinear", "DequantizeLinear", "Identity"})


@dataclass
class Node:
    """One ONNX node, or one node standing for a fused pattern of them."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    members: tuple = ()  # the original nodes of a fused pattern
    segment: int = 0     # early-exit If else-branches the node is nested in (0: the main graph)


@dataclass
class ImportResult:
    layers: list[LayerSpec]
    unsupported: Counter  # op type -> nodes no handler priced
    nodes: int            # nodes in the model's graph (and its early-exit branches)
    inputs: dict[str, Shape]
    notes: list[str]      # what the user should know about the import (one line each)
    # Early exits: their names (from If nodes named exit_<name>, else exit0, exit1, ...),
    # outermost first, and "final" (the final classifier) last; ["final"] without exits.
    exits: list[str] = field(default_factory=lambda: ["final"])
    # The layout reorders onnxruntime's CPU provider runs for the model (`layout.reorders`),
    # for each vector width it may block channels by (`layout.BLOCKS`).
    layouts: dict[int, list[Reorder]] = field(default_factory=dict)


class UnknownShape(Exception):
    """Shape inference left a tensor a handler needs without a static shape."""


class Graph:
    """The model as handlers see it: shapes, bit widths, producers and consumers, and the
    layers emitted so far (which later handlers may fuse into)."""

    def __init__(self, model: onnx.ModelProto, nodes: list[Node], const: set[str],
                 shapes: Optional[dict[str, Optional[Shape]]] = None):
        """`shapes`: the model's `_static_shapes`, where already read."""
        self.const = const
        self.shapes = _static_shapes(model) if shapes is None else shapes
        graphs = _graphs(model)
        self.types: dict[str, int] = {vi.name: vi.type.tensor_type.elem_type
                                      for sg in graphs for vi in (*sg.input, *sg.value_info, *sg.output)}
        self.types.update((init.name, init.data_type) for sg in graphs for init in sg.initializer)
        self.outputs = _graph_outputs(model)  # those of early-exit branches included
        self.nodes = nodes
        self.names = {n.name for sg in graphs for n in sg.node if n.name}  # the model's own node names
        self.producer, self.consumers = _links(nodes)
        self.layers: list[LayerSpec] = []
        self.layer_of: dict[str, int] = {}  # tensor -> index of the layer that produces it

    # --- facts about tensors ---------------------------------------------------------

    def shape(self, name: str) -> Shape:
        s = self.shapes.get(name)
        if s is None:
            raise UnknownShape(name)
        return s

    def is_const(self, name: str) -> bool:
        return name in self.const

    def bits(self, name: str) -> int:
        """Bit width of a tensor's values: from a DequantizeLinear's zero point (or its
        quantized input) up the chain of value-preserving ops, else from its type."""
        while (p := self.producer.get(name)) is not None and p.op_type in _SAME_VALUES:
            if p.op_type == "DequantizeLinear":
                zero_point = p.inputs[2] if len(p.inputs) > 2 and p.inputs[2] else p.inputs[0]
                return _BITS.get(self.types.get(zero_point), 32)
            name = p.inputs[0]
        return _BITS.get(self.types.get(name), 32)

    def activation(self, node: Node) -> str:
        """The node's first non-constant input (its data)."""
        return next((n for n in node.inputs if n and not self.is_const(n)), node.inputs[0])

    # --- building and fusing layers --------------------------------------------------

    def layer(self, op: str, node: Node, x: str, y: str, *, x_shape: Optional[str] = None, spatial: bool = False,
              **kw) -> LayerSpec:
        """A weightless layer reading tensor `x` and writing `y`, its input dims those of
        `x_shape` (default `x`); `spatial`: NCHW tensors of a conv-like op, where rank 3 is
        N, C, L.  `kw` overrides LayerSpec fields."""
        to_chw = _spatial if spatial else chw
        (cin, in_hw), (cout, out_hw) = to_chw(self.shape(x_shape or x)), to_chw(self.shape(y))
        bits = self.bits(x)
        fields = dict(op=op, in_ch=cin, out_ch=cout, in_hw=in_hw, out_hw=out_hw, w_bits=bits, a_bits=bits,
                      name=node.name)
        return LayerSpec(**{**fields, **kw})

    def fuse(self, node: Node, x: Optional[str] = None, **changes) -> bool:
        """Fold `node` into the conv or linear layer producing its input `x` (default: its
        first input), applying `changes`; False if that is not possible."""
        i = self._fusable_layer(x if x is not None else node.inputs[0])
        if i is None:
            return False
        self.layers[i] = replace(self.layers[i], **changes)
        for name in node.outputs:
            self.layer_of[name] = i
        return True

    def scales_product(self, node: Node, x: str) -> bool:
        """Whether `node` (a Mul, or a Div by its second input) multiplies a float product
        of two activations (a `matmul` layer, e.g. attention scores), or one of its inputs,
        by a constant scalar - what onnxruntime folds into the product (FusedMatMul's alpha).
        The product's output then stands for the node's."""
        other = [n for n in node.inputs if n != x]
        if self.bits(x) != 32 or len(other) != 1 or not self.is_const(other[0]) or \
                (node.op_type == "Div" and node.inputs[0] != x):
            return False
        try:
            if prod(self.shape(other[0])) != 1:
                return False
        except UnknownShape:
            return False
        y = node.outputs[0]
        i = self.layer_of.get(x)
        if i is not None and self.layers[i].op == "matmul" and len(self.consumers.get(x, ())) == 1 \
                and x not in self.outputs:
            self.layer_of[y] = i
            return True
        readers = self.consumers.get(y, ())
        return len(readers) == 1 and readers[0].op_type == "MatMul" and y not in self.outputs and \
            not any(self.is_const(n) for n in readers[0].inputs)

    def scales_conv(self, node: Node, x: str) -> bool:
        """Whether `node` (a Mul) multiplies the output of a float conv that nothing else
        reads by a constant scalar or one constant per output channel, C x 1 x 1 or 1 x C x
        1 x 1 (a layer scale: ConvNeXt's, FastViT's): onnxruntime folds it into the conv's
        weights (its ConvMulFusion), as a batch norm is folded.  It is then folded here."""
        other = [n for n in node.inputs if n != x]
        if node.op_type != "Mul" or len(other) != 1 or not self.is_const(other[0]):
            return False
        i = self._fusable_layer(x)
        if i is None or self.layers[i].op != "conv" or (self.layers[i].w_bits, self.layers[i].a_bits) != (32, 32):
            return False
        try:
            scale, out = self.shape(other[0]), self.shape(x)
        except UnknownShape:
            return False
        rank, channels = len(out), out[1] if len(out) > 1 else 0
        per_channel = (scale == () or
                       (len(scale) == rank - 1 and scale[0] == channels and prod(scale[1:]) == 1) or
                       (len(scale) == rank and scale[:2] == (1, channels) and prod(scale[2:]) == 1))
        return per_channel and self.fuse(node, x)

    def residual_sum(self, node: Node) -> bool:
        """Whether an Add is a conv's residual sum (`layers.SUM`): two float tensors of its
        output's shape, one written by a conv without an activation that nothing else reads
        (`_fusable_layer`) - or by a batch norm standing alone, which onnxruntime runs as a
        1x1 depthwise conv in its blocked layout - the other one it can hold in that layout
        too (`_blocked`).  onnxruntime accumulates such an add into the conv, and runs it as
        an add where the other operand would have to be reordered (a model input, a
        broadcast product such as a squeeze-excite scale, a transpose).  It decides by the
        machine's vector width too (a concat of channels that are not whole vector blocks
        stays in the plain layout), which the graph does not tell: on the profile's context
        networks the label agrees with whether onnxruntime ran a node for the add for 90%
        of the float adds, and no add it ran without a node is labelled stand-alone."""
        data = [n for n in node.inputs if n]
        if len(data) != 2 or any(self.is_const(n) or self.bits(n) != 32 for n in data):
            return False
        try:
            if not all(self.shape(n) == self.shape(node.outputs[0]) for n in data):
                return False
        except UnknownShape:
            return False
        return any(self._accumulates(a) and self._blocked(b) for a, b in (data, data[::-1]))

    def skip_sum(self, node: Node) -> bool:
        """Whether an Add is one onnxruntime fuses with the layer norm after it into one
        SkipLayerNormalization (`layers.SKIP`): two float tensors of its output's shape, of
        rank 3 (tokens), and a sum that only a LayerNormalization over the last axis reads
        (onnxruntime 1.32 fuses no add whose sum anything else reads, nor one that
        broadcasts, nor one of rank 2 or 4)."""
        data = [n for n in node.inputs if n]
        y = node.outputs[0]
        if len(data) != 2 or any(self.is_const(n) or self.bits(n) != 32 for n in data) or y in self.outputs:
            return False
        readers = self.consumers.get(y, ())
        if len(readers) != 1 or readers[0].op_type != "LayerNormalization" or \
                int(readers[0].attrs.get("axis", -1)) not in (-1, 2):
            return False
        try:
            return len(self.shape(y)) == 3 and all(self.shape(n) == self.shape(y) for n in data)
        except UnknownShape:
            return False

    def _accumulates(self, name: str) -> bool:
        """Whether the layer writing tensor `name` can accumulate a residual into it (see
        `residual_sum`)."""
        i = self._fusable_layer(name)
        if i is not None:
            layer = self.layers[i]
            return layer.op == "conv" and (layer.w_bits, layer.a_bits) == (32, 32)  # not an integer conv
        i = self.layer_of.get(name)
        return i is not None and (self.layers[i].op, self.layers[i].fn, self.layers[i].a_bits) == \
            ("norm", "batch", 32) and len(self.consumers.get(name, ())) == 1 and name not in self.outputs

    def _blocked(self, name: str) -> bool:
        """Whether onnxruntime can hold tensor `name` in its blocked channel layout, as far
        as the graph tells without the machine's vector width: not a model input, nor
        written by a product broadcasting one operand over the other (a squeeze-excite
        scale), a data-movement op or a token op (linear, attention, softmax, layer norm)."""
        i = self.layer_of.get(name)
        p = self.producer.get(name)
        if p is None:
            return False
        if i is None:
            return p.op_type in _SEE_THROUGH and bool(p.inputs) and self._blocked(p.inputs[0])
        layer = self.layers[i]
        if layer.op in ("data", "linear", "matmul", "softmax", "split") or (layer.op, layer.fn) == ("norm", "layer"):
            return False
        if layer.op == "mul":
            data = [x for x in p.inputs if x and not self.is_const(x)]
            try:
                return len({self.shape(x) for x in data}) == 1
            except UnknownShape:
                return False
        return True

    def _fusable_layer(self, name: str) -> Optional[int]:
        """The conv/linear layer whose output reaches only the asking node (through ops
        runtimes remove), if it has no activation yet."""
        while len(self.consumers.get(name, ())) == 1 and name not in self.outputs:
            if name in self.layer_of:
                i = self.layer_of[name]
                layer = self.layers[i]
                return i if layer.op in _FUSES_INTO and not layer.fn else None
            p = self.producer.get(name)
            if p is None or p.op_type not in _SEE_THROUGH:
                return None
            name = p.inputs[0]
        return None


def _links(nodes: list[Node]) -> tuple[dict[str, Node], dict[str, list[Node]]]:
    """Each tensor's producer, and the nodes reading it (each once)."""
    producer = {o: n for n in nodes for o in n.outputs}
    consumers: dict[str, list[Node]] = {}
    for n in nodes:
        for name in dict.fromkeys(n.inputs):
            if name:
                consumers.setdefault(name, []).append(n)
    return producer, consumers



def _spatial(shape: Shape) -> tuple[int, tuple[int, int]]:
    """channels x (H, W) of an N, C, H[, W] tensor (1-D and 2-D convs and pools)."""
    return shape[1], (shape[2], shape[3] if len(shape) == 4 else 1)


def _rows(shape: Shape) -> tuple[int, int]:
    """Positions of a matrix product's output [..., M, N] as (M, product of the rest)."""
    if len(shape) < 2:
        return (1, 1)
    return shape[-2], prod(shape[:-2])


def _pair(values: Sequence[int]) -> tuple[int, int]:
    values = tuple(values)
    return (values + (1,))[:2] if len(values) < 2 else (values[0], values[1])


# --- handlers ------------------------------------------------------------------------

Handler = Callable[[Node, Graph], Optional[list[LayerSpec]]]


def _conv(node: Node, g: Graph, x: int = 0, w: int = 1, b: Optional[int] = 2, *,
          transpose: bool = False) -> Optional[list[LayerSpec]]:
    """A convolution reading data `inputs[x]`, weight `inputs[w]` and, where the op has
    one, bias `inputs[b]` (None: the op has no bias input)."""
    x, w, y = node.inputs[x], node.inputs[w], node.outputs[0]
    bias = b is not None and len(node.inputs) > b and bool(node.inputs[b])
    ws, xs, group = g.shape(w), g.shape(x), node.attrs.get("group", 1)
    where = f"node '{node.name}' ({node.op_type})"
    if len(ws) not in (3, 4):
        return None  # 3-D convolutions: no layer kind for them
    if len(xs) != len(ws):
        raise UsageError(f"{where}: input '{x}' {list(xs)} has rank {len(xs)}, but weight '{w}' {list(ws)} "
                         f"takes rank {len(ws)}; the model is inconsistent")
    if group < 1 or ws[0] % group:
        raise UsageError(f"{where}: weight '{w}' {list(ws)} does not split into group {group}; "
                         f"the model is inconsistent")
    # Conv weights are [out, in / group, k...]; ConvTranspose weights [in, out / group, k...].
    takes = ws[0] if transpose else ws[1] * group
    if xs[1] != takes:
        raise UsageError(f"{where}: input '{x}' {list(xs)} has {xs[1]} channels, but weight '{w}' {list(ws)} "
                         f"with group {group} takes {takes}; the model is inconsistent")
    layer = g.layer("conv_transpose" if transpose else "conv", node, x, y, spatial=True, kernel=_pair(ws[2:]),
                    groups=group, stride=node.attrs.get("strides", [1])[0], w_bits=g.bits(w), a_bits=g.bits(x),
                    bias=bias)
    return [layer]


def _conv_integer(node: Node, g: Graph) -> Optional[list[LayerSpec]]:
    # x, w, x_zero_point, w_zero_point: no bias
    return _conv(node, g, b=None)


def _conv_transpose(node: Node, g: Graph) -> Optional[list[LayerSpec]]:
    return _conv(node, g, transpose=True)


def _qlinear_conv(node: Node, g: Graph) -> Optional[list[LayerSpec]]:
    # x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point[, B]
    return _conv(node, g, 0, 3, 8)


def _product(node: Node, g: Graph, a: str, b: str, *, trans_a: bool = False, trans_b: bool = False,
             bias: bool = False) -> list[LayerSpec]:
    """A matrix product [..., M, K] @ [..., K, N]: `linear` when one side is a weight,
    `matmul` when both are activations.  `bias`: the op adds a constant bias (Gemm's C);
    a MatMul has none until a following constant `Add` is folded into it."""
    sa, sb = g.shape(a), g.shape(b)
    for name, shape in ((a, sa), (b, sb)):
        if not shape:
            raise UsageError(f"node '{node.name}' ({node.op_type}): '{name}' is a scalar; a matrix product takes "
                             f"tensors of rank 1 and up; the model is inconsistent")
    ka = (sa[-2] if trans_a else sa[-1]) if len(sa) > 1 else sa[0]
    kb = (sb[-1] if trans_b else sb[-2]) if len(sb) > 1 else sb[0]
    if ka != kb:
        raise UsageError(f"node '{node.name}' ({node.op_type}): inner dimensions differ: '{a}' {list(sa)}"
                         f"{' transposed' if trans_a else ''} gives {ka}, '{b}' {list(sb)}"
                         f"{' transposed' if trans_b else ''} takes {kb}; the model is inconsistent")
    out, k = g.shape(node.outputs[0]), ka
    if g.is_const(a) and not g.is_const(b):  # W[M, K] @ X[..., K, N]: N positions, M outputs each
        rows = (out[-1], prod(out[:-2]))
        return [LayerSpec("linear", k, out[-2], rows, rows, w_bits=g.bits(a), a_bits=g.bits(b), bias=bias,
                          name=node.name)]
    rows = _rows(out)
    op = "linear" if g.is_const(b) else "matmul"
    return [LayerSpec(op, k, out[-1] if out else 1, rows, rows, w_bits=g.bits(b), a_bits=g.bits(a),
                      bias=bias and op == "linear", name=node.name)]


def _matmul(node: Node, g: Graph) -> list[LayerSpec]:
    return _product(node, g, node.inputs[0], node.inputs[1])


def _gemm(node: Node, g: Graph) -> list[LayerSpec]:
    # Y = A' B' + C: C is a bias when it is a constant (else an activation added)
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    return _product(node, g, node.inputs[0], node.inputs[1], trans_a=bool(node.attrs.get("transA", 0)),
                    trans_b=bool(node.attrs.get("transB", 0)), bias=bool(c) and g.is_const(c))


def _qlinear_matmul(node: Node, g: Graph) -> list[LayerSpec]:
    # a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point
    return _product(node, g, node.inputs[0], node.inputs[3])


def _batch_norm(node: Node, g: Graph) -> list[LayerSpec]:
    if g.fuse(node, bias=True):  # folded: its shift becomes the layer's bias
        return []
    return [g.layer("norm", node, node.inputs[0], node.outputs[0], fn="batch")]


def _norm(fn: str) -> Handler:
    def handle(node: Node, g: Graph) -> list[LayerSpec]:
        kind = LAYER_OPS if fn == "layer" and _runs_op_by_op(node, g) else fn
        return [g.layer("norm", node, node.inputs[0], node.outputs[0], fn=kind)]
    return handle


def _runs_op_by_op(norm: Node, g: Graph) -> bool:
    """Whether a layer norm spelled out in ops (`_layer_norm`) reduces over an axis other
    than the innermost: onnxruntime's LayerNormFusion takes only the innermost, so such a
    norm (ConvNeXt's and EdgeNeXt's `channels_first` LayerNorm) runs op by op."""
    if not norm.members:
        return False
    mean = norm.members[0]
    shape = g.shape(mean.inputs[0])
    axes = {a for a in _reduced_axes(mean, shape, g.shape(mean.outputs[0])) if shape[a] != 1}
    return axes != {len(shape) - 1}


def _activation(fn: str) -> Handler:
    def handle(node: Node, g: Graph) -> list[LayerSpec]:
        if g.fuse(node, fn=fn):
            return []
        return [g.layer("act", node, node.inputs[0], node.outputs[0], fn=fn)]
    return handle


def _binary(op: str, fn: str = "", bias: bool = False, scale: bool = False) -> Handler:
    """Element-wise binary op; with `bias`, a constant operand after a conv or linear
    is folded into it; with `scale`, a constant scalar scaling a product of two
    activations (`Graph.scales_product`) is folded into the product, and a constant
    scale per channel of a conv's output into the conv (`Graph.scales_conv`)."""
    def handle(node: Node, g: Graph) -> list[LayerSpec]:
        x = g.activation(node)
        if bias and any(g.is_const(n) for n in node.inputs) and g.fuse(node, x, bias=True):
            return []
        if scale and (g.scales_product(node, x) or g.scales_conv(node, x)):
            return []
        kind = fn
        if node.op_type == "Add":
            kind = SUM if g.residual_sum(node) else SKIP if g.skip_sum(node) else fn
        return [g.layer(op, node, x, node.outputs[0], x_shape=node.outputs[0], fn=kind)]
    return handle


def _concat(node: Node, g: Graph) -> list[LayerSpec]:
    return [g.layer("concat", node, g.activation(node), node.outputs[0], x_shape=node.outputs[0])]


def _split(node: Node, g: Graph) -> list[LayerSpec]:
    if _taken_apart(node, g):
        return []
    return [g.layer("split", node, node.inputs[0], node.inputs[0])]


def _pool(fn: str, global_: bool = False) -> Handler:
    def handle(node: Node, g: Graph) -> Optional[list[LayerSpec]]:
        x = node.inputs[0]
        if len(g.shape(x)) not in (3, 4):
            return None  # 3-D pooling
        if not global_ and "kernel_shape" not in node.attrs:
            raise UsageError(f"node '{node.name}' ({node.op_type}): no kernel_shape attribute, which "
                             f"{node.op_type} requires; the model is malformed")
        kernel = _spatial(g.shape(x))[1] if global_ else _pair(node.attrs["kernel_shape"])
        return [g.layer("pool", node, x, node.outputs[0], spatial=True, kernel=kernel, fn=fn,
                        stride=1 if global_ else node.attrs.get("strides", [1])[0])]
    return handle


def _reduce(fn: str) -> Handler:
    """ReduceMean/ReduceMax/...: a pool over the reduced positions; fn `STRIDED` where the
    runtime reduces without its fast path (`layers.reduction_is_strided`)."""
    def handle(node: Node, g: Graph) -> list[LayerSpec]:
        layer = g.layer("pool", node, node.inputs[0], node.outputs[0], fn=fn)
        kernel = tuple(max(1, i // o) for i, o in zip(layer.in_hw, layer.out_hw))
        kind = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}.get(node.op_type,
                                                                                                    node.op_type)
        shape = g.shape(node.inputs[0])
        strided = reduction_is_strided(shape, _reduced_axes(node, shape, g.shape(node.outputs[0])), kind)
        return [replace(layer, kernel=kernel, fn=STRIDED if strided else fn)]
    return handle


def _reduced_axes(node: Node, shape: Shape, out: Shape) -> list[int]:
    """The axes a reduction reduces, from its attributes or else from its output's shape
    (kept dims of 1, or the dims left out, matched from the innermost)."""
    if node.attrs.get("axes"):
        return [int(a) % len(shape) for a in node.attrs["axes"]]
    if len(out) == len(shape):
        return [i for i, (a, b) in enumerate(zip(shape, out)) if a != b or a == 1]
    axes, j = [], len(out) - 1
    for i in range(len(shape) - 1, -1, -1):
        if j >= 0 and shape[i] == out[j]:
            j -= 1
        else:
            axes.append(i)
    return axes


def _perm(node: Node, rank: int) -> list[int]:
    return [int(a) for a in node.attrs.get("perm", range(rank - 1, -1, -1))]


def _transpose_layer(node: Node, g: Graph, x: str, shape: Shape, perm: Sequence[int]) -> LayerSpec:
    """A transpose by `perm` of a `shape` tensor of `x`'s values; its fn as
    `layers.transpose_fn` tells it (as of floats, whatever the bit width, as search spaces say)."""
    out = tuple(shape[a] for a in perm)
    view = transpose_view(shape, perm) if len(shape) > 4 else None  # `chw` folds rank 5 and up
    (cin, in_hw), (cout, out_hw) = chw(view[0]) if view else chw(tuple(shape)), chw(view[1]) if view else chw(out)
    bits = g.bits(x)
    return LayerSpec("data", cin, cout, in_hw, out_hw, w_bits=bits, a_bits=bits, name=node.name,
                     fn=transpose_fn(shape, perm))


def _split_parts(node: Node, g: Graph) -> Optional[list[int]]:
    """Where a Transpose's output is read only by two or more Slices or Gathers, or by one
    Split, that take it apart along its first axis (a `unbind` of timm's attention: [1, T,
    3, heads, d] -> [3, 1, heads, T, d] -> q, k, v), the parts' sizes along that axis, else
    None.
    onnxruntime's transpose optimizer moves the transpose behind them, and fuses them into
    one Split of the untransposed tensor (GatherSliceToSplitFusion): it runs a Split and a
    transpose of each part."""
    y = node.outputs[0]
    readers = g.consumers.get(y, [])
    if y in g.outputs or not readers or (len(readers) == 1 and readers[0].op_type != "Split"):
        return None
    try:
        shape = g.shape(y)
        if len(readers) == 1:  # a Split already (torch exports `unbind` as one from opset 18 on)
            split = readers[0]
            outs = [g.shape(o) for o in split.outputs]
            if split.inputs[0] != y or int(split.attrs.get("axis", 0)) != 0 or \
                    any(o[1:] != shape[1:] and o != shape[1:] for o in outs):
                return None
            parts = [o[0] if len(o) == len(shape) else 1 for o in outs]
            return parts if sum(parts) == shape[0] and len(parts) > 1 else None
        parts = []
        for r in readers:
            if r.inputs[0] != y or not r.outputs:
                return None
            out = g.shape(r.outputs[0])
            if r.op_type == "Gather" and int(r.attrs.get("axis", 0)) == 0 and g.is_const(r.inputs[1]) and \
                    g.shape(r.inputs[1]) == () and out == shape[1:]:
                parts.append(1)
            elif r.op_type == "Slice" and len(out) == len(shape) and out[1:] == shape[1:] and 0 < out[0] < shape[0] \
                    and all(g.is_const(i) for i in r.inputs[1:] if i):
                parts.append(out[0])
            else:
                return None
    except UnknownShape:
        return None
    return parts if sum(parts) == shape[0] else None


def _transpose(node: Node, g: Graph) -> list[LayerSpec]:
    """A data movement; where Slices, Gathers or a Split take its output apart
    (`_split_parts`), the Split of its input and a transpose of each part onnxruntime runs
    in its place."""
    x = g.activation(node)
    shape = g.shape(x)
    perm = _perm(node, len(shape))
    parts = _split_parts(node, g)
    if parts is None:
        return [_transpose_layer(node, g, x, shape, perm)]
    split = g.layer("split", node, x, x)
    return [split] + [_transpose_layer(node, g, x, tuple(k if a == perm[0] else d for a, d in enumerate(shape)), perm)
                      for k in parts]


def _taken_apart(node: Node, g: Graph) -> bool:
    """Whether `node` is one of the Slices, Gathers or the Split a transpose's layers
    price (`_split_parts`)."""
    p = g.producer.get(node.inputs[0]) if node.inputs else None
    return p is not None and p.op_type == "Transpose" and _split_parts(p, g) is not None


def _gather(node: Node, g: Graph) -> list[LayerSpec]:
    """A data movement; fn `STRIDED` where each index copies fewer than WHOLE_BLOCK elements
    (the data's dims after the axis; onnxruntime copies them piece by piece), else "gather":
    LeViT's int8 attention biases, 4 x 196 -> 4 x 196 x 196 along the last axis, take
    0.25 ms a gather where their table is dequantized at every inference."""
    if _taken_apart(node, g):
        return []
    shape = g.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        raise UsageError(f"node '{node.name}' (Gather): axis {axis} is outside -{len(shape)}..{len(shape) - 1} for "
                         f"data of rank {len(shape)}; the model is malformed")
    strided = prod(shape[axis % len(shape) + 1:]) < WHOLE_BLOCK
    return [g.layer("data", node, g.activation(node), node.outputs[0], fn=STRIDED if strided else "gather")]


def _slice_op(node: Node, g: Graph) -> list[LayerSpec]:
    """A data movement, or nothing where it is one of the parts a transpose's layers price
    (`_split_parts`)."""
    return [] if _taken_apart(node, g) else [g.layer("data", node, g.activation(node), node.outputs[0], fn="slice")]


def _resize(node: Node, g: Graph) -> list[LayerSpec]:
    x = node.inputs[0]
    return [g.layer("resize", node, x, node.outputs[0], spatial=len(g.shape(x)) in (3, 4),
                    fn=node.attrs.get("mode", b"nearest").decode())]


def _unary(op: str, fn: str = "") -> Handler:
    def handle(node: Node, g: Graph) -> list[LayerSpec]:
        return [g.layer(op, node, g.activation(node), node.outputs[0], fn=fn)]
    return handle


def _cast(node: Node, g: Graph) -> list[LayerSpec]:
    """A data movement; nothing where its input already has the type it casts to and it
    writes no output of the model, a node onnxruntime removes when it loads the model (its
    cast elimination; EfficientViT-B0's 20 float-to-float casts, 4% of its price where
    they were priced)."""
    if g.types.get(node.inputs[0]) == node.attrs.get("to") and node.outputs[0] not in g.outputs:
        return []
    return [g.layer("data", node, g.activation(node), node.outputs[0], fn="cast")]


def _nothing(node: Node, g: Graph) -> list[LayerSpec]:
    return []


HANDLERS: dict[str, Handler] = {
    "Conv": _conv, "ConvTranspose": _conv_transpose, "QLinearConv": _qlinear_conv, "ConvInteger": _conv_integer,
    "Gemm": _gemm, "MatMul": _matmul, "QLinearMatMul": _qlinear_matmul, "MatMulInteger": _matmul,
    "BatchNormalization": _batch_norm, "LayerNormalization": _norm("layer"),
    "InstanceNormalization": _norm("instance"), "GroupNormalization": _norm("group"),
    **{op: _activation(fn) for op, fn in [
        ("Relu", "relu"), ("Clip", "clip"), ("HardSwish", "hardswish"), ("HardSigmoid", "hardsigmoid"),
        ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Gelu", "gelu"), ("LeakyRelu", "leakyrelu"),
        ("PRelu", "prelu"), ("Elu", "elu"), ("Selu", "selu"), ("Softplus", "softplus"), ("Mish", "mish"),
        ("Swish", "swish")]},
    # onnxruntime's own activations, as its optimizer writes them into saved models.
    **{f"com.microsoft.{op}": _activation(fn) for op, fn in [
        ("Gelu", "gelu"), ("FastGelu", "gelu"), ("BiasGelu", "gelu"), ("QuickGelu", "swish")]},
    # Element-wise math outside the patterns above: stand-alone activations.
    **{op: _unary("act", op.lower()) for op in ("Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Erf", "Pow")},
    "Add": _binary("add", bias=True), "Sub": _binary("add", "sub"), "Mul": _binary("mul", scale=True),
    "Div": _binary("mul", "div", scale=True),
    "Concat": _concat, "Split": _split,
    "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalMaxPool": _pool("max", global_=True), "GlobalAveragePool": _pool("avg", global_=True),
    # Reductions are pools over the reduced positions: sums and norms cost what a mean does.
    **{op: _reduce("avg") for op in ("ReduceMean", "ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                                     "ReduceLogSum", "ReduceLogSumExp", "ReduceProd")},
    "ReduceMax": _reduce("max"), "ReduceMin": _reduce("max"),
    "Resize": _resize, "Upsample": _resize, "Softmax": _unary("softmax"),
    **{op: _unary("data", op.lower()) for op in ("Pad", "Expand", "Tile", "DepthToSpace", "SpaceToDepth")},
    "Cast": _cast,
    "Slice": _slice_op,
    "Gather": _gather,
    "Transpose": _transpose,
    # Views and quantization glue; Shape, Size and Constant compute on what is known at
    # load time and never reach a handler.
    **{op: _nothing for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout",
                               "QuantizeLinear", "DequantizeLinear")},
}


# --- fused patterns ------------------------------------------------------------------

class _Patterns:
    """Pattern matching over the original nodes."""

    def __init__(self, nodes: list[Node], const: set[str]):
        self.const = const
        self.producer, self.consumers = _links(nodes)

    def of(self, name: str, *ops: str) -> Optional[Node]:
        """The producer of `name` if its op is one of `ops`."""
        p = self.producer.get(name)
        return p if p is not None and p.op_type in ops else None

    def next(self, node: Node, *ops: str) -> Optional[Node]:
        """The only consumer of `node`'s output, if its op is one of `ops`."""
        users = self.consumers.get(node.outputs[0], [])
        return users[0] if len(users) == 1 and users[0].op_type in ops else None

    def other(self, node: Node, name: str) -> Optional[str]:
        """`node`'s input that is not `name` (binary ops)."""
        rest = [i for i in node.inputs if i != name]
        return rest[0] if len(rest) == 1 else None

    def with_const(self, node: Optional[Node], name: str) -> bool:
        """`node` combines `name` with a constant."""
        return node is not None and self.other(node, name) in self.const


Pattern = Callable[[_Patterns, Node], Optional[tuple[str, str, list[Node]]]]


def _erf_gelu(p: _Patterns, erf: Node):
    """x * 0.5 * (1 + erf(x / sqrt 2)), as torch exports nn.GELU before opset 20."""
    if erf.op_type != "Erf" or (scale := p.of(erf.inputs[0], "Div", "Mul")) is None:
        return None
    x = scale.inputs[0]
    add = p.next(erf, "Add")
    if not p.with_const(scale, x) or not p.with_const(add, erf.outputs[0]):
        return None
    mul = p.next(add, "Mul")
    if mul is None:
        return None
    other = p.other(mul, add.outputs[0])
    if other == x:  # (x * (1 + erf)) * 0.5
        half = p.next(mul, "Mul")
        return ("Gelu", x, [scale, erf, add, mul, half]) if p.with_const(half, mul.outputs[0]) else None
    half = p.of(other, "Mul") if other else None  # (x * 0.5) * (1 + erf)
    return ("Gelu", x, [scale, erf, add, half, mul]) if p.with_const(half, x) else None


def _hard_swish(p: _Patterns, node: Node):
    """x * HardSigmoid(x), or x * Clip(x + 3, 0, 6) / 6 (in either order)."""
    if node.op_type == "HardSigmoid":
        x, mul = node.inputs[0], p.next(node, "Mul")
        return ("HardSwish", x, [node, mul]) if mul is not None and p.other(mul, node.outputs[0]) == x else None
    if node.op_type != "Clip" or (shift := p.of(node.inputs[0], "Add")) is None:
        return None
    x = next((i for i in shift.inputs if i not in p.const), None)
    first = p.next(node, "Div", "Mul")
    second = p.next(first, "Div", "Mul") if first is not None else None
    if x is None or second is None or not p.with_const(shift, x):
        return None
    if p.with_const(first, node.outputs[0]) and p.other(second, first.outputs[0]) == x:
        return ("HardSwish", x, [shift, node, first, second])
    if p.other(first, node.outputs[0]) == x and p.with_const(second, first.outputs[0]):
        return ("HardSwish", x, [shift, node, first, second])
    return None


def _swish(p: _Patterns, sig: Node):
    """x * Sigmoid(x) (SiLU), as torch exports nn.SiLU."""
    if sig.op_type != "Sigmoid":
        return None
    x, mul = sig.inputs[0], p.next(sig, "Mul")
    return ("Swish", x, [sig, mul]) if mul is not None and p.other(mul, sig.outputs[0]) == x else None


def _layer_norm(p: _Patterns, mean: Node):
    """(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta]."""
    if mean.op_type != "ReduceMean":
        return None
    x = mean.inputs[0]
    users = p.consumers.get(mean.outputs[0], [])
    sub = next((n for n in users if n.op_type == "Sub" and n.inputs == [x, mean.outputs[0]]), None)
    if sub is None:
        return None
    d = sub.outputs[0]
    users = p.consumers.get(d, [])
    square = next((n for n in users if n.op_type == "Pow" or (n.op_type == "Mul" and n.inputs == [d, d])), None)
    if square is None or (var := p.next(square, "ReduceMean")) is None:
        return None
    eps = p.next(var, "Add")
    if not p.with_const(eps, var.outputs[0]) or (root := p.next(eps, "Sqrt")) is None:
        return None
    div = p.next(root, "Div")
    if div is None or div.inputs != [d, root.outputs[0]]:
        return None
    members = [mean, sub, square, var, eps, root, div]
    for op in ("Mul", "Add"):  # the affine part
        nxt = p.next(members[-1], op)
        if p.with_const(nxt, members[-1].outputs[0]):
            members.append(nxt)
    return ("LayerNormalization", x, members)


PATTERNS: list[Pattern] = [_layer_norm, _erf_gelu, _hard_swish, _swish]


def _fuse_patterns(nodes: list[Node], const: set[str], patterns: Sequence[Pattern], outputs: set[str]) -> list[Node]:
    """`nodes` with each matched pattern replaced by one node (at its last member's place)."""
    p = _Patterns(nodes, const)
    index = {id(n): i for i, n in enumerate(nodes)}
    taken: dict[int, Node] = {}  # id of an original node -> the fused node replacing it
    for pattern in patterns:
        for node in nodes:
            if id(node) in taken or not (match := pattern(p, node)):
                continue
            op, x, members = match
            ids = {id(m) for m in members}
            out = max(members, key=lambda m: index[id(m)]).outputs[0]
            inner = [o for m in members for o in m.outputs if o != out]
            if ids & taken.keys() or any(o in outputs or any(id(c) not in ids for c in p.consumers.get(o, []))
                                          for o in inner):
                continue  # overlaps another match, or an inner value is used elsewhere
            fused = Node(op, members[0].name, [x], [out], members=tuple(members))
            for m in members:
                taken[id(m)] = fused
    result = []
    for node in nodes:
        fused = taken.get(id(node))
        if fused is None:
            result.append(node)
        elif index[id(node)] == max(index[id(m)] for m in fused.members):
            result.append(fused)
    return result


# --- early exits: If-nested branches ----------------------------------------------------
#
# `nasctl export` writes a network with early exits as nested If nodes, one per exit
# (named exit_<name>): the condition is the exit's decision (its confidence against a
# threshold), the then-branch passes the exit head's logits (and the exit's index) on,
# and the else-branch computes the rest of the network, the next exit's If included.
# Their nodes are imported as one list: a layer's `segment` is the number of else-branches
# it is nested in; exit heads (whose values reach a then-branch, never an else-branch or
# the model's outputs) get role "exit"; decision nodes (whose values reach only If
# conditions) are not priced.  Other If nodes (and loops) are not looked into.

_BRANCH_OPS = frozenset({"Identity", "Constant"})


def _branches(node: onnx.NodeProto) -> dict[str, onnx.GraphProto]:
    return {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}


def _exit_if(node: onnx.NodeProto) -> bool:
    """Whether `node` is an early exit: an If whose then-branch only passes values on and
    whose else-branch computes."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
        return False
    b = _branches(node)
    return "then_branch" in b and "else_branch" in b and all(n.op_type in _BRANCH_OPS for n in b["then_branch"].node) \
        and any(n.op_type not in _BRANCH_OPS for n in b["else_branch"].node)


def _flat(graph: onnx.GraphProto, depth: int = 0):
    """(node, depth) of each node of `graph`, the branches of each early-exit If in its
    place (before it): its then-branch at `depth`, its else-branch one deeper."""
    for node in graph.node:
        if node.op_type == "If" and _exit_if(node):  # (the op type first: most nodes are not)
            b = _branches(node)
            yield from _flat(b["then_branch"], depth)
            yield from _flat(b["else_branch"], depth + 1)
        yield node, depth


def _exits(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The early-exit If nodes, outermost first."""
    found, graph = [], model.graph
    while True:
        node = next((n for n in graph.node if _exit_if(n)), None)
        if node is None:
            return found
        found.append(node)
        graph = _branches(node)["else_branch"]


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The main graph and the branches of its early-exit If nodes."""
    out = [model.graph]
    if not any(node.op_type == "If" for node in model.graph.node):  # no exits: one graph
        return out
    for node, _ in _flat(model.graph):
        if _exit_if(node):
            b = _branches(node)
            out += [b["then_branch"], b["else_branch"]]
    return out


def _graph_outputs(model: onnx.ModelProto) -> set[str]:
    """The values leaving a graph: the model's outputs and those of early-exit branches."""
    return {o.name for g in _graphs(model) for o in g.output}


def exit_names(model: onnx.ModelProto) -> list[str]:
    """The exits' names (exit_<name> If nodes: <name>; others exit0, exit1, ...), then "final"."""
    names: list[str] = []
    for k, node in enumerate(_exits(model)):
        name = node.name[5:] if node.name.startswith("exit_") else ""
        names.append(name if name and name not in names and name != "final" else f"exit{k}")
    return [*names, "final"]


def _unique_branch_names(model: onnx.ModelProto) -> None:
    """Rename the values defined in early-exit branches that another graph defines too
    (sibling branches may reuse names), so that every value has one producer."""
    seen = {i.name for i in (*model.graph.input, *model.graph.initializer)}
    seen.update(o for n in model.graph.node for o in n.output if o)

    def rename(graph: onnx.GraphProto, outer: dict[str, str]) -> None:
        scope = dict(outer)

        def define(name: str) -> str:
            if not name:
                return name
            new, i = name, 0
            while new in seen:
                i += 1
                new = f"{name}__{i}"
            seen.add(new)
            scope[name] = new
            return new

        for init in graph.initializer:
            init.name = define(init.name)
        for node in graph.node:
            node.input[:] = [scope.get(i, i) for i in node.input]
            if _exit_if(node):
                for branch in _branches(node).values():
                    rename(branch, scope)
            node.output[:] = [define(o) for o in node.output]
        for vi in (*graph.output, *graph.value_info):
            vi.name = scope.get(vi.name, vi.name)

    for node in model.graph.node:
        if _exit_if(node):
            for branch in _branches(node).values():
                rename(branch, {})


def _exit_reach(nodes: list[Node], consumers: Mapping[str, list[Node]], model: onnx.ModelProto) -> dict[int, set]:
    """For each node (by id), where its values lead: "then" (an exit's then-branch
    output), "out" (an else-branch's or the model's output), "cond" (an exit's condition)."""
    exits = _exits_all(model)
    ifs = {o for n in exits for o in n.output}
    sinks: dict[str, str] = {o.name: "out" for o in model.graph.output}
    for node in exits:
        b = _branches(node)
        sinks.update((o.name, "out") for o in b["else_branch"].output)
        sinks.update((o.name, "then") for o in b["then_branch"].output)
    reach: dict[int, set] = {}
    for node in reversed(nodes):
        if node.op_type == "If" and node.outputs and node.outputs[0] in ifs:
            continue
        r: set = set()
        for name in node.outputs:
            if name in sinks:
                r.add(sinks[name])
            for c in consumers.get(name, ()):
                if c.op_type == "If" and c.outputs and c.outputs[0] in ifs:
                    r.add("cond")  # an exit reads only its condition
                else:
                    r |= reach.get(id(c), set())
        reach[id(node)] = r
    return reach


def _exits_all(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every early-exit If node (nested ones included)."""
    return [n for n, _ in _flat(model.graph) if _exit_if(n)]


# --- loading -------------------------------------------------------------------------

# --- reading a model without its weights' values ---------------------------------------

def _varint(buf, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def _fields(buf, start: int, end: int):
    """(field number, wire type, value start, value end, field start) of each field of the
    protobuf message in buf[start:end]."""
    i = start
    while i < end:
        first = i
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(buf, i)
            yield number, wire, first, i, first
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            yield number, wire, i - (8 if wire == 1 else 4), i, first
        elif wire == 2:
            n, i = _varint(buf, i)
            yield number, wire, i, i + n, first
            i += n
        else:
            raise ValueError(f"wire type {wire}")
    if i != end:
        raise ValueError("truncated")


_GRAPH, _INITIALIZER = 7, 5        # ModelProto.graph, GraphProto.initializer
_TENSOR_VALUES = {4, 5, 6, 7, 9, 10, 11}  # TensorProto's float/int32/string/int64/raw/double/uint64 data
_KEEP_BYTES = 40_000               # initializers up to this size keep their values (any of `_SMALL` elements)


def _without_weights(buf) -> bytes:
    """The serialized model in `buf` with the values of its large initializers left out
    (their names, types and dims kept), so that parsing it copies no weights."""
    out = []
    for number, wire, start, end, first in _fields(buf, 0, len(buf)):
        if (number, wire) != (_GRAPH, 2):
            out.append(buf[first:end])
            continue
        parts = []
        for gnumber, gwire, gstart, gend, gfirst in _fields(buf, start, end):
            if (gnumber, gwire) == (_INITIALIZER, 2) and gend - gstart > _KEEP_BYTES:
                body = b"".join(buf[tf:te] for tn, _, _, te, tf in _fields(buf, gstart, gend) if tn not in _TENSOR_VALUES)
                parts.append(bytes([_INITIALIZER << 3 | 2]) + _encode_varint(len(body)) + body)
            else:
                parts.append(buf[gfirst:gend])
        body = b"".join(parts)
        out.append(bytes([_GRAPH << 3 | 2]) + _encode_varint(len(body)) + body)
    return b"".join(out)


def _read_model(path: Path) -> onnx.ModelProto:
    """The model at `path` without the values of its large weights: the file is mapped, not
    read, and only the rest is parsed (a 344 MB ViT-B parses in milliseconds)."""
    import mmap

    with open(path, "rb") as f:
        if not f.seek(0, 2):
            return onnx.ModelProto()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            data = _without_weights(mapped)  # slices of a map are copies: only what is kept is read
    return onnx.load_model_from_string(data)


def load_model(path: Path) -> onnx.ModelProto:
    """Parse the file without its large weights' values (weights stored apart stay on disk
    too); bad files fail in one line."""
    from google.protobuf.message import Error as ProtobufError

    try:
        model = _read_model(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder, not an ONNX model") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read it: {e.strerror}") from None
    except (ProtobufError, ValueError, IndexError):
        raise UsageError(f"{path}: not an ONNX model (it does not parse: truncated, or another format)") from None
    g = model.graph
    defined = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    problem = None
    if model.ir_version <= 0 or not g.node:
        problem = "no graph"
    elif not g.output:
        problem = "no graph outputs"
    elif not model.opset_import:
        problem = "no opset version"
    elif model.ir_version > onnx.IR_VERSION:
        raise UsageError(f"{path}: ONNX IR version {model.ir_version} is newer than the installed onnx "
                         f"{onnx.__version__} reads (up to {onnx.IR_VERSION}); upgrade onnx or re-export the model")
    else:
        _check_opsets(model, path)
        for node in g.node:
            missing = next((i for i in node.input if i not in defined), None)
            if missing is not None:
                problem = f"node '{node.name or node.op_type}' reads undefined tensor '{missing}'"
                break
            again = next((o for o in node.output if o and o in defined), None)
            if again is not None:
                raise UsageError(f"{path}: not a valid ONNX model (node '{node.name or node.op_type}' writes "
                                 f"tensor '{again}', which is already defined)")
            defined.update(node.output)
    if problem:
        raise UsageError(f"{path}: not a complete ONNX model ({problem}; truncated?)")
    return model


# Operator-set domains whose newest version the installed onnx knows.
_OPSETS = {"": ("default ai.onnx", onnx.defs.onnx_opset_version),
           "ai.onnx": ("ai.onnx", onnx.defs.onnx_opset_version),
           "ai.onnx.ml": ("ai.onnx.ml", onnx.defs.onnx_ml_opset_version)}


def _check_opsets(model: onnx.ModelProto, path: Path) -> None:
    """Refuse an opset the installed onnx does not know: its shape inference would
    guess at ops it has no definition for."""
    for opset in model.opset_import:
        if opset.domain not in _OPSETS:
            continue  # other domains (com.microsoft, ...): their nodes are reported as not imported
        label, newest = _OPSETS[opset.domain]
        newest = newest()
        if opset.version > newest:
            raise UsageError(f"{path}: opset {opset.version} ({label} domain) is newer than the installed onnx "
                             f"{onnx.__version__} supports (up to {newest}); re-export the model with opset "
                             f"<= {newest} or upgrade onnx")
        if opset.version < 1:
            raise UsageError(f"{path}: opset {opset.version} ({label} domain) is not an opset version "
                             f"(1 to {newest}); the model is malformed")


def _fix_inputs(model: onnx.ModelProto, shapes: Mapping[Optional[str], Shape], path: Path) -> dict[str, Shape]:
    """Give every graph input a static shape (from `shapes` where given); batch must be 1."""
    g = model.graph
    weights = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in weights]
    names = [i.name for i in inputs]
    shapes = dict(shapes)
    if None in shapes:
        if len(inputs) != 1:
            raise UsageError(f"--input-shape: the model has inputs {', '.join(names)}; give NAME:SHAPE for each")
        shapes[names[0]] = shapes.pop(None)
    for name in shapes:
        if name not in names:
            raise UsageError(f"--input-shape: the model has no input '{name}'; its inputs: {', '.join(names)}")
    fixed = {}
    for inp in inputs:
        if not inp.type.HasField("tensor_type"):
            kind = inp.type.WhichOneof("value")
            what = f"is a {kind.replace('_type', '')}, not a tensor" if kind else "has no type"
            raise UsageError(f"{path.name}: input '{inp.name}' {what}; nasctl prices models whose inputs are "
                             f"tensors")
        dims = inp.type.tensor_type.shape.dim
        current = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        example = "x".join(d if d.isdigit() else "N" for d in current)
        if inp.name in shapes:
            shape = tuple(shapes[inp.name])
            if dims and len(shape) != len(dims):
                raise UsageError(f"--input-shape {inp.name}: {len(shape)} dims given; the input has {len(dims)} "
                                 f"[{', '.join(current)}]")
            # Only dynamic dims may be set; and a static batch may be set to 1 (one input is priced).
            clash = [f"dim {i} is {d}, {v} given" for i, (d, v) in enumerate(zip(current, shape))
                     if d.isdigit() and int(d) != v and not (i == 0 and v == 1 and len(shape) >= 2)]
            if clash:
                raise UsageError(f"--input-shape {inp.name}:{'x'.join(map(str, shape))}: the input is declared "
                                 f"[{', '.join(current)}] ({'; '.join(clash)}); only its dynamic dims can be set: "
                                 f"give {inp.name}:{_merged(current, shape)}")
            del dims[:]
            for v in shape:
                inp.type.tensor_type.shape.dim.add().dim_value = v
        elif not inp.type.tensor_type.HasField("shape"):
            raise UsageError(f"{path.name}: input '{inp.name}' has no declared shape; give it with --input-shape "
                             f"{inp.name}:DIMS, e.g. {inp.name}:1x3x224x224")
        elif not all(d.isdigit() for d in current):
            raise UsageError(f"{path.name}: input '{inp.name}' has dynamic dims [{', '.join(current)}]; give them "
                             f"with --input-shape {inp.name}:{example}")
        else:
            shape = tuple(int(d) for d in current)
        if any(v < 1 for v in shape):
            raise UsageError(f"{path.name}: input '{inp.name}' has shape [{', '.join(map(str, shape))}]; every dim "
                             f"must be 1 or more (an empty input has no cost to price)")
        if len(shape) >= 2 and shape[0] != 1:
            ones = "x".join(["1", *map(str, shape[1:])])
            raise UsageError(f"{path.name}: input '{inp.name}' has batch {shape[0]}; nasctl prices one input at "
                             f"a time: give --input-shape {inp.name}:{ones}")
        fixed[inp.name] = shape
    return fixed


def _merged(declared: Sequence[str], given: Sequence[int]) -> str:
    """`given` with the declared static dims put back (batch 1 kept): what the user likely meant."""
    return "x".join(d if d.isdigit() and not (i == 0 and v == 1) else str(v)
                    for i, (d, v) in enumerate(zip(declared, given)))


def _infer(model: onnx.ModelProto, notes: list[str]) -> tuple[onnx.ModelProto, dict[str, Optional[Shape]]]:
    """Shape inference (strict, with data propagation); where it leaves a node's outputs
    unknown because an input is computed from shapes in a way data propagation cannot
    follow (e.g. Shape -> Gather -> Div -> Slice, as torch exports `chunk`), that input is
    folded to a constant and inference runs again.  The model and its `_static_shapes`."""
    strict, values = True, {}
    while True:
        try:
            model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=strict, data_prop=True)
        except onnx.shape_inference.InferenceError as e:
            notes.append(f"shape inference (strict) failed, shapes taken leniently: {' '.join(str(e).split())[:300]}")
            strict = False
            continue
        known = _static_shapes(model)
        values = _fold(model, known, values)
        stuck = [n for n in model.graph.node if not all(known.get(o) is not None for o in n.output if o)]
        wanted = {i for n in stuck for i in n.input if i in values}
        replaced = [n for n in model.graph.node if n.output and all(o in values for o in n.output)
                    and wanted & set(n.output)]
        if not replaced:
            return model, known
        gone = {id(n) for n in replaced}
        _keep_only(model.graph.node, [n for n in model.graph.node if id(n) not in gone])
        model.graph.initializer.extend(numpy_helper.from_array(values[o], o) for n in replaced for o in n.output)
        # Shapes left symbolic are inferred afresh (inference keeps what value_info says).
        _keep_only(model.graph.value_info, [vi for vi in model.graph.value_info
                                            if known.get(vi.name) is not None and vi.name not in values])


def _keep_only(field, kept: list) -> None:
    """Replace a repeated protobuf field's items by `kept` (one rebuild: removing items
    one by one is quadratic in the field's length)."""
    copies = [type(k)() for k in kept]
    for c, k in zip(copies, kept):
        c.CopyFrom(k)
    del field[:]
    field.extend(copies)


def _run_for_shapes(model: onnx.ModelProto, notes: list[str],
                    known: dict[str, Optional[Shape]]) -> dict[str, Optional[Shape]]:
    """Where shape inference left tensors without a static shape (shapes computed in ways
    it cannot follow), run the model once with onnxruntime on a random input, every such
    tensor made an output, and take the shapes it produced.  Large weights, whose values
    were dropped, run as zeros of their shape: shapes do not depend on them.  `known`: the
    model's `_static_shapes`; returned as they are then."""
    from onnx import helper

    g = model.graph
    if all(known.get(o) is not None for n in g.node for o in n.output if o):
        return known
    const = _constants(model, _nodes(model))
    wanted = list(dict.fromkeys(o for n in g.node for o in n.output
                                if o and known.get(o) is None and o not in const))
    if not wanted:
        return known
    import onnxruntime as ort

    runnable = onnx.ModelProto()
    runnable.CopyFrom(model)
    rg = runnable.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.value_info, *g.output)}
    zeros, kept = [], []
    for init in rg.initializer:
        if prod(init.dims) > _SMALL or init.data_location == TensorProto.EXTERNAL:
            dims = numpy_helper.from_array(np.array(list(init.dims), dtype=np.int64), f"{init.name}__dims")
            kept.append(dims)
            zero = helper.make_tensor("zero", init.data_type, [1], [0])
            zeros.append(helper.make_node("ConstantOfShape", [dims.name], [init.name], value=zero))
        else:
            kept.append(init)
    del rg.initializer[:]
    rg.initializer.extend(kept)
    nodes = list(rg.node)
    del rg.node[:]
    rg.node.extend(zeros + nodes)
    outputs = {o.name for o in rg.output}
    rg.output.extend(helper.make_tensor_value_info(name, types.get(name, 0) or TensorProto.FLOAT, None)
                     for name in wanted if name not in outputs)
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(runnable.SerializeToString(), so, providers=["CPUExecutionProvider"])
        from .measure.timing import random_feed

        names = [o.name for o in sess.get_outputs()]
        values = dict(zip(names, sess.run(None, random_feed(sess, np.random.default_rng(0)))))
    except Exception as e:  # noqa: BLE001 - onnxruntime cannot run it: the shapes stay unknown
        notes.append(f"{len(wanted)} tensors have no static shape after shape inference, and running the model "
                     f"once to find them failed: {' '.join(str(e).split())[:200]}")
        return known
    found = {n: np.shape(values[n]) for n in wanted if n in values}
    _keep_only(g.value_info, [vi for vi in g.value_info if vi.name not in found])
    g.value_info.extend(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), list(shape))
                        for n, shape in found.items())
    notes.append(f"shapes of {len(found)} tensors that shape inference could not find were read from one run of "
                 f"the model with onnxruntime")
    return _static_shapes(model)


def _static_shapes(model: onnx.ModelProto) -> dict[str, Optional[Shape]]:
    """Each tensor's static shape (None: not static), those of early-exit branches included."""
    shapes: dict[str, Optional[Shape]] = {}
    graphs = _graphs(model)
    for g in graphs:
        for vi in (*g.input, *g.value_info, *g.output):
            t = vi.type.tensor_type
            dims = t.shape.dim if t.HasField("shape") else None
            ok = dims is not None and all(d.HasField("dim_value") for d in dims)
            shapes[vi.name] = tuple(d.dim_value for d in dims) if ok else None
    for g in graphs:
        for init in g.initializer:
            shapes[init.name] = tuple(init.dims)
    return shapes


_SMALL = 4096  # elements: the most a folded shape computation may hold
# Quantization nodes stay: they say which layers are quantized (and runtimes fuse them).
_NEVER_FOLDED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def _fold(model: onnx.ModelProto, shapes: Mapping[str, Optional[Shape]],
          done: Optional[Mapping[str, "np.ndarray"]] = None) -> dict[str, "np.ndarray"]:
    """Values of the small tensors computed from constants and shapes alone (nodes
    of the default domain whose ops `_FOLD` knows); initializers are not returned.
    `done`: values folded before from this model's nodes, with no fewer shapes known
    (`_infer`'s previous pass): a node whose outputs all have one is not computed again."""
    small = {i.name: i for g in _graphs(model) for i in g.initializer
             if prod(i.dims) <= _SMALL and i.data_location != TensorProto.EXTERNAL}
    values: dict[str, np.ndarray] = {k: v for k, v in (done or {}).items() if k not in small}

    def value(name: str):
        if name not in values and name in small:
            try:
                values[name] = numpy_helper.to_array(small[name])
            except ValueError:  # no values: left out when the model was read (over _KEEP_BYTES)
                return None
        return values.get(name)

    get = onnx.helper.get_attribute_value
    for node, _ in _flat(model.graph):
        if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLDED \
                or any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            continue
        if node.output and all(o in values for o in node.output if o):
            continue  # folded in an earlier pass
        fold = _FOLD.get(node.op_type)
        if node.op_type in ("Shape", "Size"):
            if shapes.get(node.input[0]) is None:
                continue
            args = [np.array(shapes[node.input[0]], dtype=np.int64)]
        else:
            args = [value(i) if i else None for i in node.input]
            if any(a is None for a, i in zip(args, node.input) if i) or not any(node.input) and fold is None:
                continue
        try:
            if fold is not None:
                outs = [np.asarray(fold({a.name: get(a) for a in node.attribute}, *args))]
            else:  # an op without a rule here: onnx's reference implementation of it
                outs = [np.asarray(v) for v in _reference(node, args)]
        except Exception:  # noqa: BLE001 - not foldable here (any error): shape inference decides
            continue
        for name, out in zip(node.output, outs):
            if name and out.size <= _SMALL:
                values[name] = out
    return {k: v for k, v in values.items() if k not in small}


def _reference(node, args: Sequence[Optional[np.ndarray]]) -> list:
    """The node's outputs on `args` by onnx's reference implementation (small tensors only)."""
    from onnx.reference import ReferenceEvaluator

    named = [(i, a) for i, a in zip(node.input, args) if i]
    if any(a.size > _SMALL for _, a in named):
        raise ValueError("too large to fold")
    return ReferenceEvaluator(node).run(None, dict(named))


def _axes(attrs: dict, axes) -> Optional[list[int]]:
    return [int(a) for a in (axes if axes is not None else attrs.get("axes", []))] or None


def _slice(attrs, x, starts, ends, axes=None, steps=None):
    index = [slice(None)] * x.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for a, b, e, st in zip(axes, starts, ends, steps):
        index[int(a)] = slice(int(b), int(e), int(st))
    return x[tuple(index)]


def _reshape(attrs, x, shape):
    target = [x.shape[i] if v == 0 and not attrs.get("allowzero", 0) else int(v) for i, v in enumerate(shape)]
    return x.reshape(target)


def _constant(attrs):
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    key = next(k for k in ("value_int", "value_ints", "value_float", "value_floats") if k in attrs)
    return np.array(attrs[key], dtype=np.int64 if "int" in key else np.float32)


def _constant_of_shape(attrs, shape):
    if prod(shape) > _SMALL:
        raise ValueError("too large to fold")
    return np.full(tuple(shape), numpy_helper.to_array(attrs["value"])[0] if "value" in attrs else np.float32(0))


def _unsqueeze(attrs, x, axes=None):
    axes = sorted(a % (x.ndim + len(_axes(attrs, axes))) for a in _axes(attrs, axes))
    for a in axes:
        x = np.expand_dims(x, a)
    return x


_FOLD: dict[str, Callable] = {
    "Constant": _constant,
    "Shape": lambda attrs, s: s[attrs.get("start", 0):attrs.get("end", len(s))],
    "Size": lambda attrs, s: np.array(prod(s), dtype=np.int64),
    "Identity": lambda attrs, x: x,
    "Cast": lambda attrs, x: x.astype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])),
    "Gather": lambda attrs, x, i: np.take(x, i, axis=attrs.get("axis", 0)),
    "Unsqueeze": _unsqueeze,
    "Squeeze": lambda attrs, x, axes=None: np.squeeze(x, axis=tuple(a % x.ndim for a in _axes(attrs, axes) or [])
                                                       or None),
    "Concat": lambda attrs, *xs: np.concatenate(xs, axis=attrs["axis"]),
    "Add": lambda attrs, a, b: a + b,
    "Sub": lambda attrs, a, b: a - b,
    "Mul": lambda attrs, a, b: a * b,
    "Div": lambda attrs, a, b: np.fix(a / b).astype(a.dtype) if a.dtype.kind in "iu" else a / b,  # C-like
    "Slice": _slice,
    "Reshape": _reshape,
    "Equal": lambda attrs, a, b: a == b,
    "Where": lambda attrs, c, a, b: np.where(c, a, b),
    "ConstantOfShape": _constant_of_shape,
    "Range": lambda attrs, start, limit, delta: np.arange(start, limit, delta),
    "Floor": lambda attrs, x: np.floor(x),
    "Ceil": lambda attrs, x: np.ceil(x),
    "Sqrt": lambda attrs, x: np.sqrt(x),
    "Neg": lambda attrs, x: -x,
    "Abs": lambda attrs, x: np.abs(x),
    "Mod": lambda attrs, a, b: np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b),
    "Max": lambda attrs, *xs: np.maximum.reduce(xs),
    "Min": lambda attrs, *xs: np.minimum.reduce(xs),
    "Transpose": lambda attrs, x: np.transpose(x, attrs.get("perm")),
    "Expand": lambda attrs, x, shape: x * np.ones(tuple(int(d) for d in shape), dtype=x.dtype),
}


def _nodes(model: onnx.ModelProto) -> list[Node]:
    """The model's nodes, those of early-exit branches included (`_flat`)."""
    get = onnx.helper.get_attribute_value
    return [Node(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}",
                 n.name or f"{n.op_type}_{i}", list(n.input), list(n.output),
                 {a.name: get(a) for a in n.attribute if a.type != onnx.AttributeProto.GRAPH}, segment=depth)
            for i, (n, depth) in enumerate(_flat(model.graph))]


_NEUTRAL = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}
_NEUTRAL_MOST = 1 << 16  # the most elements of a constant read to tell whether it is neutral


def _without_neutral_ops(model: onnx.ModelProto, nodes: list[Node], folder: Path,
                         shapes: Optional[dict[str, Optional[Shape]]] = None) -> list[Node]:
    """`nodes` with each element-wise op of a neutral constant - an add of zeros, or a
    product by ones, either side; a subtraction of zeros or a division by ones - that
    leaves its other input's shape as it is written as an Identity of that input.
    onnxruntime removes such nodes (they run nothing), and what they stood between fuses:
    MobileOne's blocks export an add of 0 (their missing identity branch) after their
    summed convs, which then take the relu after it, and ConvNeXt-V2's global response
    norms an add of their bias, zeros as first set.  A constant stored apart is read from
    its file beside the model (`folder`); `shapes`: the model's `_static_shapes` where read."""
    values = {i.name: i for sg in _graphs(model) for i in sg.initializer if prod(i.dims) <= _NEUTRAL_MOST}
    values.update((n.outputs[0], n.attrs["value"]) for n in nodes
                  if n.op_type == "Constant" and isinstance(n.attrs.get("value"), onnx.TensorProto))
    outputs, done = _graph_outputs(model), []
    for node in nodes:
        sides = ((1, 0), (0, 1)) if node.op_type in ("Add", "Mul") else ((1, 0),)
        if node.op_type in _NEUTRAL and len(node.inputs) == 2 and node.outputs and node.outputs[0] not in outputs:
            for c, x in sides:
                if node.inputs[c] not in values or not node.inputs[x] or node.inputs[x] in values:
                    continue
                value = _small_array(values[node.inputs[c]], folder)
                if value is None:
                    continue
                if value.size == 0 or value.size > _NEUTRAL_MOST or not np.all(value == _NEUTRAL[node.op_type]):
                    continue
                shapes = _static_shapes(model) if shapes is None else shapes
                ours, theirs = shapes.get(node.outputs[0]), shapes.get(node.inputs[x])
                if (ours == theirs and ours is not None) or (ours is None and value.size == 1 and value.ndim <= 1):
                    node = replace(node, op_type="Identity", inputs=[node.inputs[x]], attrs={})
                    break
        done.append(node)
    return done


def _small_array(tensor: TensorProto, folder: Path) -> Optional[np.ndarray]:
    """The values of a constant of at most _NEUTRAL_MOST elements (read from its file in
    `folder` where stored apart), or None where they cannot be read as numbers."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    try:
        if uses_external_data(tensor):
            tensor = TensorProto.FromString(tensor.SerializeToString())
            load_external_data_for_tensor(tensor, str(folder))
        return numpy_helper.to_array(tensor)
    except (OSError, ValueError, TypeError, onnx.checker.ValidationError):  # a missing file, not numbers
        return None


def _constants(model: onnx.ModelProto, nodes: list[Node], runs: Optional[frozenset] = None) -> set[str]:
    """Tensors known when the model is loaded: weights, constants, shapes, and what is
    computed from them alone.

    onnxruntime folds no DequantizeLinear (it keeps them for the QDQ groups it fuses), so a
    node computed from a dequantized constant - LeViT's int8 attention biases gathered from
    their table - may run at every inference: with `runs`, the (name, op type) of the nodes
    onnxruntime's optimized graph runs (`InRuntime.float_nodes`), such a node found there
    is not a constant (nor what is computed from it)."""
    const = {i.name for g in _graphs(model) for i in g.initializer}
    dequantized: set[str] = set()  # constants computed from a dequantized constant
    for node in nodes:
        if node.op_type in ("Shape", "Size") or all(not i or i in const for i in node.inputs):
            from_dq = node.op_type == "DequantizeLinear" or any(i in dequantized for i in node.inputs)
            if from_dq and runs is not None and node.op_type not in _NEVER_FOLDED and \
                    (node.name, node.op_type) in runs:
                continue  # run at every inference
            const.update(node.outputs)
            if from_dq:
                dequantized.update(node.outputs)
    return const


def import_onnx(path: Path, input_shapes: Optional[Mapping[Optional[str], Shape]] = None,
                handlers: Optional[Mapping[str, Handler]] = None,
                patterns: Optional[Sequence[Pattern]] = None, runtime=None) -> ImportResult:
    """The layers of the ONNX model at `path`.

    `input_shapes` maps input names to shapes (the key None: the model's only input);
    every input with a dynamic dimension needs one.  `handlers` and `patterns` replace
    `HANDLERS` and `PATTERNS`.  `runtime`: the future of `_in_runtime(path)` started
    earlier (as `nasctl predict` does), else it is started here where the model is quantized.
    """
    path = Path(path)
    model = load_model(path)
    exits = exit_names(model)
    if len(exits) > 1:
        _unique_branch_names(model)
    # Which QDQ groups onnxruntime fuses is read from the graph it optimizes the model into;
    # its session is built on another thread (it releases the GIL) while shapes are inferred.
    if not any(n.op_type == "DequantizeLinear" for n, _ in _flat(model.graph)):
        runtime = None
    elif runtime is None:
        from .early import in_thread

        runtime = in_thread(_in_runtime, path)
    fixed = _fix_inputs(model, input_shapes or {}, path)
    count = sum(1 for _ in _flat(model.graph))
    notes: list[str] = []
    model, shapes = _infer(model, notes)
    shapes = _run_for_shapes(model, notes, shapes)
    table = HANDLERS if handlers is None else handlers
    nodes = _without_neutral_ops(model, _nodes(model), path.parent, shapes)
    ran = runtime.result() if runtime is not None else None
    const = _constants(model, nodes, ran.float_nodes if ran is not None else None)
    outputs = _graph_outputs(model)
    g = Graph(model, _fuse_patterns(nodes, const, PATTERNS if patterns is None else patterns, outputs), const, shapes)
    unsupported: Counter = Counter()
    made_by: list[Node] = []  # the node each layer comes from
    reach = _exit_reach(g.nodes, g.consumers, model) if len(exits) > 1 else None
    decisions = 0
    for node in g.nodes:
        if all(o in const for o in node.outputs):
            continue  # computed on constants alone: folded when the model loads
        if reach is not None:
            where = reach.get(id(node))
            if where is None:
                continue  # an exit's If: its branches' nodes are imported in their place
            if where == {"cond"}:
                decisions += 1  # an exit decision: not priced
                continue
        handler = table.get(node.op_type)
        try:
            layers = handler(node, g) if handler is not None else None
        except UnknownShape:
            unsupported[f"{node.op_type} (shape unknown)"] += 1
            continue
        except UsageError as e:  # the model contradicts itself at this node
            raise UsageError(f"{path.name}: {e}") from None
        if layers is None:
            unsupported[node.op_type] += 1
            continue
        if reach is not None:
            role = "exit" if "then" in where and "out" not in where else "backbone"
            layers = [replace(layer, segment=node.segment, role=role) for layer in layers]
        g.layers.extend(layers)
        made_by.extend([node] * len(layers))
        if layers:
            for name in node.outputs:
                g.layer_of[name] = len(g.layers) - 1
    written: dict[int, list[str]] = {}  # layer -> the tensors it produces
    for name, i in g.layer_of.items():
        written.setdefault(i, []).append(name)
    if not any(n.op_type == "DequantizeLinear" for n in g.nodes):
        ran = None
    for i, node in enumerate(made_by):
        layer = g.layers[i]
        if not _quantized_kernel(layer):
            continue
        if _runs_dequantized(g, i, node, written.get(i, []), ran.float_nodes if ran is not None else None):
            g.layers[i] = replace(layer, dequantized=True)
        elif (layer.op, layer.fn) == ("pool", "max") and ran is not None and \
                (node.members[0] if node.members else node).name in ran.plain_pools:
            g.layers[i] = replace(layer, fn=MAX_NCHW)
    if decisions:
        notes.append(f"{decisions} nodes of the exits' decisions (each exit's confidence against its threshold) "
                     f"are not priced")
    return ImportResult(g.layers, unsupported, count, fixed, notes, exits, _layout(g, model, ran))


def _layout(g: Graph, model: onnx.ModelProto, ran: Optional["InRuntime"]) -> dict[int, list[Reorder]]:
    """The model's layout reorders (`layout.reorders`): its float weights are its float
    initializers and what Identity nodes pass on of them (not what a DequantizeLinear makes:
    onnxruntime fuses such a conv into an integer one); its 8-bit tensors those `bits` tells,
    but the input of a pool onnxruntime runs on floats (`ran`)."""
    floats = {i.name for sg in _graphs(model) for i in sg.initializer if i.data_type == TensorProto.FLOAT}
    noops: dict[str, str] = {}  # (neutral element-wise ops are Identity nodes here: `_without_neutral_ops`)
    for node in g.nodes:
        if node.op_type == "Identity" and node.inputs and node.inputs[0] in floats:
            floats.update(node.outputs)
        elif node.op_type in ("Identity", "Dropout") and node.inputs and node.outputs:
            noops[node.outputs[0]] = node.inputs[0]
    eight_bit = {name for name in g.shapes if g.bits(name) < 32}
    if ran is not None:
        eight_bit -= {n.inputs[0] for n in g.nodes if n.inputs and (n.name, n.op_type) in ran.float_nodes}
    return {block: [replace(r, layer=_writer(g, r.tensor)) for r in
                    reorders(g.nodes, g.const, g.shapes, floats, g.outputs, noops, eight_bit, block)]
            for block in BLOCKS}


def _writer(g: Graph, tensor: str) -> int:
    """The layer writing `tensor`, through the ops that write none (a reshape, an identity);
    the first layer for a model input."""
    for _ in range(64):
        if tensor in g.layer_of:
            return g.layer_of[tensor]
        p = g.producer.get(tensor)
        if p is None or not p.inputs:
            return 0
        tensor = g.activation(p)
    return 0


# Ops onnxruntime also runs on 8-bit values under their own name: the QDQ nodes around them
# dropped, they compute on the quantized tensor (a fused group), else on the dequantized one.
EIGHT_BIT_OPS = frozenset({"MaxPool", "Resize"})


@dataclass(frozen=True)
class InRuntime:
    """What onnxruntime's CPU provider makes of a quantized model's nodes (`_in_runtime`).

    `float_nodes`: (name, op type) of the nodes it runs as they are on float values - not
    fused into an integer kernel or any other op, not run on the quantized values.
    `plain_pools`: names of the 8-bit max pools it runs in its plain channels-first uint8
    kernel (`layers.MAX_NCHW`), not converted to the channels-last `NhwcMaxPool`."""

    float_nodes: frozenset
    plain_pools: frozenset


def optimized_nodes(path: Path, level) -> list:
    """The nodes (those of subgraphs too) of the graph onnxruntime's CPU provider optimizes
    the ONNX model at `path` into at optimization `level` (`ort.GraphOptimizationLevel`);
    onnxruntime's own error where it cannot load the model."""
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="nasctl-ort-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 4  # fatal only: the caller handles a model it cannot load
        so.intra_op_num_threads = so.inter_op_num_threads = 1  # no thread pools to start
        so.graph_optimization_level = level
        # the optimized graph is all that is read: no kernel needs its weights packed
        so.add_session_config_entry("session.disable_prepacking", "1")
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return list(all_nodes(_read_model(Path(so.optimized_model_filepath)).graph))


def runtime_reorders(path: Path) -> dict[str, int]:
    """The layout reorder nodes onnxruntime's CPU provider itself puts in its fully optimized
    graph of the ONNX model at `path`, by direction ("in", "out"): what `layout.reorders`
    predicts, read from this machine's runtime (for checking it; pricing builds no session)."""
    import onnxruntime as ort

    nodes = optimized_nodes(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return dict(Counter("in" if n.op_type == "ReorderInput" else "out" for n in nodes
                        if n.op_type in ("ReorderInput", "ReorderOutput")))


def _in_runtime(path: Path) -> Optional[InRuntime]:
    """Read from the graphs onnxruntime optimizes the model into: QDQ fusion (extended
    optimizations, layout changes not) and, where the model has 8-bit max pools, the
    layout each runs in (all optimizations).  None where it cannot load the model."""
    try:
        import onnxruntime as ort

        nodes = optimized_nodes(path, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
        made_by = {o: n.op_type for n in nodes for o in n.output}
        onnx_op = [bool(n.name) and n.domain in ("", "ai.onnx") for n in nodes]
        on_float = [n.op_type not in EIGHT_BIT_OPS or made_by.get(n.input[0] if n.input else "") ==
                    "DequantizeLinear" for n in nodes]
        float_nodes = frozenset((n.name, n.op_type) for n, o, f in zip(nodes, onnx_op, on_float) if o and f)
        pools = {n.name for n, o, f in zip(nodes, onnx_op, on_float) if o and not f and n.op_type == "MaxPool"}
        plain = frozenset()
        if pools:  # converted to NhwcMaxPool, a pool gets another name and domain
            try:
                plain = frozenset(n.name for n in optimized_nodes(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
                                  if n.op_type == "MaxPool" and n.domain in ("", "ai.onnx") and n.name in pools)
            except Exception:  # noqa: BLE001 - not fully optimized: its pools count as channels-last
                pass
    except Exception:  # noqa: BLE001 - the runtime cannot load it: the graph's structure decides
        return None
    return InRuntime(float_nodes, plain)


def all_nodes(graph: onnx.GraphProto):
    """The graph's nodes and those of every subgraph in them (If branches, loop bodies)."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from all_nodes(sub)


def _quantized_kernel(layer: LayerSpec) -> bool:
    """Whether a layer computes on quantized values (data movement runs on them either way)."""
    return min(layer.w_bits, layer.a_bits) < 32 and layer.op != "data"


def _runs_dequantized(g: Graph, i: int, node: Node, written: Sequence[str],
                      apart: Optional[set[tuple[str, str]]] = None) -> bool:
    """Whether quantized layer `i` (made from `node`, writing the tensors `written`, those
    of the nodes fused into it included) is a QDQ group that the runtime does not fuse into
    one integer kernel.  `apart`: the nodes onnxruntime runs as they are on float values
    (`InRuntime.float_nodes`); the node's name among them decides.  Otherwise (or for a node
    without a name of its own) the structure does, an approximation of onnxruntime's QDQ
    selectors: one of the quantized tensors it reads (out of a DequantizeLinear) has other
    readers, or its output has another reader than one QuantizeLinear whose values each
    reach one node."""
    original = node.members[0] if node.members else node
    if apart is not None and original.name in g.names:
        return (original.name, original.op_type) in apart
    data = [x for x in dict.fromkeys(node.inputs) if x and not g.is_const(x)]
    quantized = [x for x in data if (p := g.producer.get(x)) is not None and p.op_type == "DequantizeLinear"]
    if not quantized:
        return False
    if any(len(g.consumers.get(x, ())) > 1 for x in quantized):
        return True
    for name in written:
        readers = [c for c in g.consumers.get(name, ()) if any(g.layer_of.get(o) != i for o in c.outputs)]
        if not readers:
            continue
        if len(readers) > 1 or readers[0].op_type != "QuantizeLinear":
            return True
        again = g.consumers.get(readers[0].outputs[0], ())
        if len(again) > 1 or any(len(g.consumers.get(d.outputs[0], ())) > 1 for d in again):
            return True
    return False
