"""`LayerSpec`: the one intermediate representation between networks and devices.

Search spaces emit it, the ONNX importer emits it, and every cost model prices it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

# Op kinds a cost model may be asked to price.  Tensors are described as channels x
# (height, width); a sequence of T tokens of width C is C x (T, 1).
#   conv      2-D convolution (groups == in_ch for depthwise); batch-norm and the
#             activation that follows (`fn`) are fused into it, as runtimes do.
#   conv_transpose  transposed convolution (in_hw -> larger out_hw).
#   linear    fully connected layer with weights, applied at each of the out_hw positions.
#   matmul    products of two activations (attention): out_hw = (M rows, number of
#             products, e.g. heads), each M x in_ch (the reduced dimension) x out_ch;
#             no weights.
#   pool      pooling, `fn` "max" or "avg" (global when out_hw == (1, 1)).  An 8-bit max
#             pool with fn "max_nchw" (`MAX_NCHW`) is one a runtime runs on the quantized
#             values in its plain channels-first kernel, not in the channels-last layout of
#             the integer convs around it: onnxruntime's uint8 `MaxPool` where what feeds it
#             (a QLinearConcat or QLinearAdd) is not channels-last, about 30x the time
#             per element of its `NhwcMaxPool` (`onnx_import._in_runtime`).
#   add, mul  element-wise binary ops on tensors of the output shape.  An add with fn
#             "sum" (`SUM`) is a residual sum of a conv's output (a float conv without an
#             activation, whose output nothing else reads) and a tensor of its shape in
#             the conv's layout: what runtimes accumulate into the conv's output buffer
#             instead of running an add (onnxruntime's blocked-layout and fused convs, with
#             the activation after it; `onnx_import.Graph.residual_sum`).
#   act       a stand-alone activation, `fn` names it (relu, sigmoid, gelu, ...).
#   softmax, norm (layer/instance normalisation), resize, concat, split
#   data      data movement only: reshape, transpose, flatten, squeeze, ...
MAC_OPS = frozenset({"conv", "conv_transpose", "linear", "matmul"})
OPS = MAC_OPS | {"pool", "add", "mul", "act", "softmax", "norm", "resize", "concat", "split", "data"}
SUM = "sum"  # the fn of an add that is a conv's residual sum (see above)
MAX_NCHW = "max_nchw"  # the fn of an 8-bit max pool run in a plain channels-first kernel (above)


@dataclass(frozen=True, slots=True)
class LayerSpec:
    op: str
    in_ch: int
    out_ch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int] = (1, 1)
    stride: int = 1
    groups: int = 1
    w_bits: int = 32
    a_bits: int = 32
    # Early exits: `segment` is the index (0-based, over the network's active exits,
    # the final classifier last) of the first exit this layer lies before.  Exit-head
    # layers carry their own exit's index and role "exit".  Reaching exit k costs every
    # layer whose segment is <= k.
    segment: int = 0
    role: str = "backbone"
    fn: str = ""  # sub-kind: the fused or stand-alone activation, the pooling mode
    # A quantized layer that runs dequantized: a runtime keeps its DequantizeLinear ->
    # float op -> QuantizeLinear nodes apart instead of fusing them into one integer
    # kernel (onnxruntime fuses such a group only where each quantized tensor it reads
    # or writes has no other reader).  Accelerators price its bit widths all the same.
    dequantized: bool = False
    # Whether a conv or linear layer adds a bias of its own (one value per output
    # channel): a bias input, or a batch norm or constant `Add` folded into it.  Counted
    # in `params` and `weight_bytes`.  Not part of `shape_key`: tables key kernels by
    # shape (their rows do not record it), and costs cached per shape key are shared by
    # a layer and its bias-free twin; a bias is out_ch values beside the weights.
    bias: bool = True
    name: str = field(default="", compare=False)

    @property
    def macs(self) -> int:
        """Multiply-accumulates for one input."""
        if self.op == "conv":
            kh, kw = self.kernel
            return self.out_hw[0] * self.out_hw[1] * self.out_ch * (self.in_ch // self.groups) * kh * kw
        if self.op == "conv_transpose":
            kh, kw = self.kernel
            return self.in_hw[0] * self.in_hw[1] * self.in_ch * (self.out_ch // self.groups) * kh * kw
        if self.op in ("linear", "matmul"):
            return self.out_hw[0] * self.out_hw[1] * self.in_ch * self.out_ch
        return 0

    @property
    def params(self) -> int:
        """Weights, and the bias where the layer has one (`bias`; a batch norm folded into
        a conv gives it one), as the deployed model stores them."""
        bias = self.out_ch if self.bias else 0
        if self.op in ("conv", "conv_transpose"):
            kh, kw = self.kernel
            return self.out_ch * (self.in_ch // self.groups) * kh * kw + bias
        if self.op == "linear":
            return self.in_ch * self.out_ch + bias
        return 0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.w_bits / 8

    @property
    def in_elems(self) -> int:
        n = self.in_ch * self.in_hw[0] * self.in_hw[1]
        return 2 * n if self.op in ("add", "mul") else n

    @property
    def out_elems(self) -> int:
        return self.out_ch * self.out_hw[0] * self.out_hw[1]

    @property
    def in_bytes(self) -> float:
        return self.in_elems * self.a_bits / 8

    @property
    def out_bytes(self) -> float:
        return self.out_elems * self.a_bits / 8

    def shape_key(self) -> tuple:
        """What determines this layer's cost (everything but its place in the network)."""
        return (self.op, self.in_ch, self.out_ch, self.in_hw, self.out_hw, self.kernel,
                self.stride, self.groups, self.w_bits, self.a_bits, self.fn, self.dequantized)


def chw(shape: tuple[int, ...]) -> tuple[int, tuple[int, int]]:
    """channels x (H, W) of a tensor as the ONNX importer reads it: rank 4 and up NCHW
    (further dims folded into W), rank 3 and below channels-last ([B, T, C] -> C x (T, B))."""
    s = shape
    if len(s) >= 4:
        return s[1], (s[2], prod(s[3:]) * s[0])
    if len(s) == 3:
        return s[2], (s[1], s[0])
    if len(s) == 2:
        return s[1], (s[0], 1)
    return (s[0] if s else 1), (1, 1)
