"""`LayerSpec`: the one intermediate representation between networks and devices.

Search spaces emit it, the ONNX importer emits it, and every cost model prices it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Optional, Sequence

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
#             the activation after it; `onnx_import.Graph.residual_sum`).  An add with fn
#             "skip" (`SKIP`) is one fused with the layer norm after it into one kernel
#             (`onnx_import.Graph.skip_sum`).
#   act       a stand-alone activation, `fn` names it (relu, sigmoid, gelu, ...).
#   softmax, norm (layer/instance normalisation), resize, concat, split.  A layer norm
#             with fn "layer_ops" (`LAYER_OPS`) is one spelled out in reductions over an
#             axis other than the innermost (ConvNeXt's and EdgeNeXt's `channels_first`
#             norm): runtimes do not fuse it into one kernel (onnxruntime's
#             LayerNormFusion takes only the innermost axis), so it runs as its nine ops,
#             each a pass over the tensor, against one pass of a fused layer norm.
#   data      data movement only: reshape, transpose, flatten, squeeze, ...
#             A transpose or a reduction (a pool) with fn "strided" (`STRIDED`) is one a
#             runtime cannot run on whole contiguous blocks: a transpose that copies pieces
#             of under 16 elements (element by element where the innermost axis moves
#             among others), a reduction other than a mean, sum or max of the innermost
#             axes (`transpose_is_strided`, `reduction_is_strided`).
MAC_OPS = frozenset({"conv", "conv_transpose", "linear", "matmul"})
OPS = MAC_OPS | {"pool", "add", "mul", "act", "softmax", "norm", "resize", "concat", "split", "data"}
SUM = "sum"  # the fn of an add that is a conv's residual sum (see above)
MAX_NCHW = "max_nchw"  # the fn of an 8-bit max pool run in a plain channels-first kernel (above)
STRIDED = "strided"  # the fn of a transpose or reduction run without contiguous blocks (above)
# The fn of a transpose that moves the innermost of its dims over 1 (`transpose_fn`).
MOVES_INNER = "inner"
LAYER_OPS = "layer_ops"  # the fn of a layer norm run op by op (above)
# The fn of an add that a runtime fuses with the layer norm reading it into one kernel
# (onnxruntime's SkipLayerNormalization: two float token tensors of one shape, N x T x C,
# whose sum only the norm reads): its time is the fused kernel's share, not an add's.
SKIP = "skip"
# The fewest elements a transpose's copies must hold to run at memory speed.
WHOLE_BLOCK = 16


def transpose_is_strided(shape: Sequence[int], perm: Sequence[int], element_bytes: int = 4) -> bool:
    """Whether a runtime copies this transpose in small pieces, as onnxruntime's CPU kernel
    does, measured on 65,536 floats (benchmarks/README.md): a permutation that keeps the
    dims over 1 in order is a plain copy; one that moves a single axis inwards runs as a
    vectorised 2-D transpose, and one that moves a single axis outwards copies the block
    of the dims after it at a time, by register where it is of at most 8 bytes (0.2-0.8 ns
    per element); any other copies its innermost unmoved block at a time, element by
    element where the innermost axis moves (3.4-3.9 ns).  Strided: copies of under
    `WHOLE_BLOCK` elements (blocks of 4 floats: 2.2-2.3 ns)."""
    shape, perm = list(shape), list(perm)
    if [a for a in perm if shape[a] > 1] == [a for a in range(len(shape)) if shape[a] > 1]:
        return False  # a reshape
    moved = _single_axis_move(perm)
    if moved is not None:
        start, end = moved
        if start < end:
            return False  # inwards: a 2-D transpose of the dims between
        block = prod(shape[start + 1:])
        return block * element_bytes > 8 and block < WHOLE_BLOCK
    block = 1
    for i in range(len(perm) - 1, -1, -1):
        if perm[i] != i:
            break
        block *= shape[i]
    return block < WHOLE_BLOCK


def transpose_fn(shape: Sequence[int], perm: Sequence[int]) -> str:
    """A transpose's fn: `STRIDED` where a runtime copies it in small pieces
    (`transpose_is_strided`), else `MOVES_INNER` where it moves the innermost of the dims
    over 1 (each element lands apart from its neighbour: a 2-D transpose), else
    "transpose" (whole blocks of the dims that stay innermost copied at a time, or a plain
    copy).  The layer's folded shapes do not always tell these apart: attention's keys,
    [1, T, heads, d] -> [1, heads, d, T], read as the split into heads, -> [1, heads, T, d],
    where T = d."""
    if transpose_is_strided(shape, perm):
        return STRIDED
    inner = [a for a in range(len(shape)) if shape[a] > 1]
    moved = [a for a in perm if shape[a] > 1]
    return MOVES_INNER if inner and moved[-1] != inner[-1] else "transpose"


def _single_axis_move(perm: Sequence[int]) -> Optional[tuple[int, int]]:
    """(from, to) where `perm` moves one axis and keeps the others in order, else None; as
    onnxruntime reads it: at the first axis out of place, a move outwards (an inner axis
    brought to it) before a move inwards (it taken further in)."""
    perm = list(perm)
    first = next((i for i, a in enumerate(perm) if a != i), None)
    if first is None:
        return None
    for start, end in ((perm[first], first), (first, None)):
        rest = [a for a in range(len(perm)) if a != start]
        for to in ([end] if end is not None else range(first + 1, len(perm))):
            if rest[:to] + [start] + rest[to:] == perm:
                return start, to
    return None


def reduction_is_strided(shape: Sequence[int], axes: Sequence[int], kind: str = "mean") -> bool:
    """Whether a runtime reduces these axes without its vectorised fast path, as onnxruntime's
    CPU kernels do (benchmarks/README.md): a mean, sum or max of the innermost axes runs at
    0.1-0.25 ns per element; an L1 or L2 norm or a sum of squares anywhere, or any reduction
    of axes with others inside them, at 0.7-3 ns; a log-sum-exp at 4 ns.  `kind`: the
    reduction ("mean", "sum", "max", "min", or another)."""
    rank = len(shape)
    reduced = {a % rank for a in axes if shape[a % rank] > 1}
    kept = [a for a in range(rank) if a not in reduced and shape[a] > 1]
    innermost = not reduced or not kept or max(kept) < min(reduced)
    return kind not in ("mean", "sum", "max", "min") or not innermost


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


def transpose_view(shape: Sequence[int], perm: Sequence[int]) -> Optional[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A transpose of [1, a, b, c] that moves the same data as `perm` does `shape` (its input
    and output shapes), or None where none does: dims of 1 dropped, and dims that stay side
    by side in order merged, leave three or fewer.  `chw` folds the dims of a tensor of
    rank 5 or more into its last, which for a transpose can hide the block that stays in
    place: ViT's [1, T, 3, heads, d] -> [3, 1, heads, T, d] keeps d in place, as
    [1, T, 3 heads, d] -> [1, 3 heads, T, d] does, but folded it reads as one moving every
    element.  (Four dims left would fold the first into the last again.)"""
    axes = [a for a in range(len(shape)) if shape[a] != 1]
    dims = [int(shape[a]) for a in axes]
    order = [axes.index(a) for a in perm if shape[a] != 1]
    merged = True
    while merged:
        merged = False
        for i in range(len(order) - 1):
            a = order[i]
            if order[i + 1] == a + 1:  # input dims a and a + 1 stay side by side: one dim
                dims[a:a + 2] = [dims[a] * dims[a + 1]]
                order = [b - 1 if b > a + 1 else b for b in order[:i + 1] + order[i + 2:]]
                merged = True
                break
    if len(dims) > 3:
        return None
    pad = 4 - len(dims)
    inp = (1,) * pad + tuple(dims)
    return inp, tuple(inp[a] for a in [*range(pad), *(b + pad for b in order)])


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
