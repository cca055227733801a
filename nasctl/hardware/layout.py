"""Where onnxruntime's CPU provider moves tensors between channel layouts.

onnxruntime runs float convs in a blocked channel layout (NCHWc: channels in blocks of the
vector width, 16 floats on AVX-512, 8 on AVX2) and carries that layout through the ops
after them that can run in it: pools, elementwise sums and products of equal shapes,
activations, batch norms, nearest/linear resizes, channel concats of whole blocks.  Where a
tensor in the blocked layout is read by an op that cannot (a layer norm, a reshape, a
broadcast product such as a squeeze-excite scale, a concat of channels that are not whole
blocks, a graph output), it inserts a `ReorderOutput` node; where a plain tensor feeds a
blocked conv or pool, a `ReorderInput`.  Those nodes are kernels of their own: 26% of
GhostNet's time here, under 1% of MobileNetV2's (`benchmarks/layout.py`).

`reorders(nodes, ..., block)` predicts those nodes from the graph, as onnxruntime 1.32's layout
transformer decides them (`core/optimizer/nchwc_transformer.cc`), with the rules measured
on this runtime where they differ from that source: a dense conv of 16 input channels or
more, and a depthwise conv, run blocked when their channels are a multiple of 4
(`ALIGN`), not only of the block; relu, sigmoid, tanh, hard sigmoid, hard swish and GELU
run blocked on their own (clip, leaky relu and the other elementwise ops do not), and so
do linear resizes.  It reads no weights and imports neither onnxruntime nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod
from typing import AbstractSet as Set, Mapping, Optional, Sequence

ALIGN = 4  # channels a blocked conv's input (and a depthwise conv's channels) must be a multiple of
# The vector widths in floats onnxruntime's blocked layout uses: 8 (AVX2), 16 (AVX-512).  The
# importer finds a model's reorders for each; a profiled device prices those of its own
# width (`lut.LayoutCost.block`, the one its context networks' profiles agree with).
BLOCKS = (8, 16)

# Ops that run blocked on a blocked input of one tensor (onnxruntime 1.32, measured: not
# Clip, LeakyRelu, Elu, Erf, Exp and other elementwise ops); "Swish" is the importer's
# x * Sigmoid(x), a sigmoid and a product of equal shapes, both blocked.
_UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "com.microsoft.Gelu", "Swish"})
# Activations onnxruntime fuses into the conv before them where nothing else reads the conv.
_FUSED_ACTIVATIONS = frozenset({"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip", "HardSwish"})
_POOLS = frozenset({"MaxPool", "AveragePool"})
_GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool"})


@dataclass(frozen=True)
class Reorder:
    """One layout reorder: `kind` "in" (into the blocked layout), "out" (back to the plain
    one) or "out_last" (to channels-last, standing for a transpose); the tensor it reorders
    (for "in" the plain one read, else the plain one written) and its shape."""

    kind: str
    tensor: str
    shape: tuple[int, ...]
    layer: int = 0  # the layer its cost is charged to (the one writing the tensor, where one does)
    # Whether it replaces that layer: a transpose between channels-first and channels-last
    # that onnxruntime folds into the reorder (it then runs no node of its own).
    replaces: bool = False

    @property
    def elements(self) -> int:
        return prod(self.shape)

    @property
    def direction(self) -> str:
        """"in" or "out" (a reorder to channels-last is one out of the blocked layout)."""
        return "in" if self.kind == "in" else "out"


@dataclass
class _Blocked:
    channels: int
    uses: int  # readers not yet running blocked (a graph output counts as one)
    shape: tuple[int, ...]


def _conv_runs_blocked(w: tuple[int, ...], groups: int, block: int) -> Optional[bool]:
    """Whether a float conv of weights `w` (O, I/groups, kH, kW) runs blocked: None where it
    does and reads its input plain (fewer input channels than a block), else True/False."""
    if len(w) != 4:
        return False
    out_ch, in_per_group = w[0], w[1]
    if groups > 1:
        if in_per_group == 1 and out_ch == groups:  # depthwise
            return out_ch % ALIGN == 0
        return in_per_group % block == 0 and (out_ch // groups) % block == 0
    if in_per_group < block:
        return None
    return in_per_group % ALIGN == 0


def reorders(nodes: Sequence, const: Set[str], shapes: Mapping[str, Optional[tuple[int, ...]]],
             float_weights: Set[str], outputs: Set[str], noops: Optional[Mapping[str, str]] = None,
             eight_bit: Set[str] = frozenset(), block: int = 16) -> list[Reorder]:
    """The layout reorders onnxruntime's CPU provider runs for a model: `nodes` its nodes in
    topological order as the importer reads them (`onnx_import.Node`, patterns such as an
    erf GELU or a layer norm fused into one), `const` the tensors known when it loads,
    `shapes` each tensor's static shape (None or missing: unknown), `float_weights` the
    constant float tensors, `outputs` the graph outputs, `noops` the outputs of nodes
    onnxruntime removes (an Identity, an add of zero) -> their input, `eight_bit` the tensors
    of 8-bit values (a conv or pool reading one runs in an integer kernel).  A node of an
    early-exit branch (`segment`) reads a tensor of another segment in the plain layout, as
    a subgraph reads an outer tensor."""
    noops = noops or {}

    def same(name: str) -> str:
        while name in noops:
            name = noops[name]
        return name

    nodes = [replace(n, inputs=[same(i) for i in n.inputs]) for n in nodes if not (n.outputs and n.outputs[0] in noops)]
    outputs = {same(o) for o in outputs}
    readers: dict[str, list] = {}
    for node in nodes:
        if node.outputs and all(o in const for o in node.outputs):
            continue  # folded when the model loads (a Shape of a static tensor): it reads nothing
        for name in node.inputs:
            if name:
                readers.setdefault(name, []).append(node)
    writer = {o: node for node in nodes for o in node.outputs}  # not graph inputs nor weights

    def shape(name: str) -> Optional[tuple[int, ...]]:
        s = shapes.get(name)
        return tuple(s) if s is not None else None

    def uses(name: str) -> int:
        return sum(n.inputs.count(name) for n in readers.get(name, ())) + (name in outputs)

    # Fusions onnxruntime makes before it changes layouts: a conv's batch norm, constant
    # bias add or scale and activation, where nothing else reads the conv's output.  The
    # last fused node's output stands for the conv's.
    root: dict[str, str] = {n.outputs[0]: n.outputs[0] for n in nodes if n.op_type == "Conv" and n.outputs}
    final = dict(root)
    fused: set[int] = set()
    for node in nodes:
        x = node.inputs[0] if node.inputs else ""
        if x not in root or uses(x) != 1 or x in outputs or final[root[x]] != x:
            continue
        others = [i for i in node.inputs[1:] if i]
        if (node.op_type == "BatchNormalization" and all(i in const for i in others)) or \
                (node.op_type in ("Add", "Mul") and len(others) == 1 and others[0] in const) or \
                (node.op_type in _FUSED_ACTIVATIONS and all(i in const for i in others)):
            root[node.outputs[0]] = root[x]
            final[root[x]] = node.outputs[0]
            fused.add(id(node))

    blocked: dict[str, _Blocked] = {}
    made: list[Reorder] = []
    reordered_in: set[str] = set()

    def make_blocked(out: str, channels: int) -> None:
        out = final.get(out, out)
        blocked[out] = _Blocked(channels, uses(out), shape(out) or ())

    def read_into_block(name: str, held: Set[str]) -> None:
        """A blocked conv or pool reads tensor `name`: held blocked already, else reordered in."""
        if name in const:  # folded with the op reading it
            return
        if name in held:
            blocked[name].uses -= 1
        elif name not in reordered_in:
            reordered_in.add(name)
            # a channels-last tensor transposed back for a blocked op alone: the reorder reads
            # it channels-last, in place of the transpose
            p = writer.get(name)
            folded = p is not None and p.op_type == "Transpose" and list(p.attrs.get("perm", [])) == [0, 3, 1, 2] \
                and uses(name) == 1
            made.append(Reorder("in", name, shape(name) or (), replaces=folded))

    for node in nodes:
        if id(node) in fused:
            continue
        op, ins = node.op_type, [i for i in node.inputs if i]
        data = [i for i in ins if i not in const]
        # what this node can read in the blocked layout: not a tensor of another segment
        held = {i for i in data if i in blocked and (i not in writer or writer[i].segment == node.segment)}
        y = node.outputs[0] if node.outputs else ""
        if any(i in eight_bit for i in data):
            continue
        if op == "Conv" and len(ins) >= 2 and ins[1] in float_weights:
            w = shape(ins[1]) or ()
            mode = _conv_runs_blocked(w, int(node.attrs.get("group", 1)), block)
            if mode is False:
                continue
            if mode is True:
                read_into_block(ins[0], held)
            make_blocked(y, w[0])
        elif (op in _POOLS or op in _GLOBAL_POOLS) and len(node.outputs) == 1:
            s = shape(ins[0])
            if s is None or len(s) != 4 or s[1] % block:
                continue
            if op in _GLOBAL_POOLS and ins[0] not in held and ins[0] in writer:
                continue  # a global pool is taken only on a blocked input or a graph input
            read_into_block(ins[0], held)
            make_blocked(y, s[1])
        elif not data or any(i not in held for i in data):
            continue  # the rest run blocked only where every input they read already is
        elif op in ("Add", "Sum", "Mul"):
            first = blocked[data[0]]
            alike = len(data) == len(ins) and all(blocked[i].channels == first.channels for i in data)
            shapes_equal = len({shape(i) for i in data}) == 1 and shape(data[0]) is not None
            if alike and (shapes_equal or op != "Mul"):
                _take(blocked, data)
                make_blocked(y, first.channels)
        elif op == "Concat":
            if int(node.attrs.get("axis", 0)) == 1 and len(data) == len(ins) and \
                    all(blocked[i].channels % block == 0 for i in data):
                _take(blocked, data)
                make_blocked(y, sum(blocked[i].channels for i in data))
        elif op in _UNARY or op == "BatchNormalization" or (op in ("Resize", "Upsample") and
                                                             _resizes_spatially(node, shapes)):
            _take(blocked, data[:1])
            make_blocked(y, blocked[data[0]].channels)
        elif op == "Transpose" and list(node.attrs.get("perm", [])) == [0, 2, 3, 1]:
            _take(blocked, data[:1])
            made.append(Reorder("out_last", y, shape(y) or (), replaces=True))
    made.extend(Reorder("out", name, b.shape) for name, b in blocked.items() if b.uses > 0)
    return made


def _take(blocked: dict, names: Sequence[str]) -> None:
    for name in names:
        blocked[name].uses -= 1


def _resizes_spatially(node, shapes: Mapping[str, Optional[tuple[int, ...]]]) -> bool:
    """A resize onnxruntime runs blocked: one whose output keeps the input's batch and
    channels and scales each spatial dim by a whole number."""
    x, y = shapes.get(node.inputs[0]), shapes.get(node.outputs[0]) if node.outputs else None
    if x is None or y is None or len(x) != 4 or len(y) != 4 or x[:2] != y[:2]:
        return False
    return all(b % a == 0 for a, b in zip(x[2:], y[2:]))


CUTS = (16384, 65536, 262144, 1048576)  # the sizes tried as a layout cost's `cut_elements`


def cost_terms(made: Sequence[Reorder], cut: int) -> dict[str, tuple[int, int, int]]:
    """Per direction ("in", "out"): the reorders, the elements they move in tensors under
    `cut` elements and in tensors of `cut` or more."""
    terms = {"in": [0, 0, 0], "out": [0, 0, 0]}
    for r in made:
        t = terms[r.direction]
        t[0] += 1
        t[1 if r.elements < cut else 2] += r.elements
    return {k: (a, b, c) for k, (a, b, c) in terms.items()}


def machine_block() -> Optional[int]:
    """The vector width in floats onnxruntime blocks channels by on this machine: 16 with
    AVX-512, 8 with AVX2 (x86 Linux, read from /proc/cpuinfo); None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return None
    return 16 if "avx512f" in flags else 8 if "avx2" in flags else None

