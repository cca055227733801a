"""`kind: nb201` - the NAS-Bench-201 cell space (Dong & Yang, ICLR 2020).

One cell, repeated through a fixed macro skeleton, is searched.  The cell is a DAG of
four nodes; node j sums the ops on its edges from every earlier node i (knob
`edge_j_i`), node 0 is the cell input and node 3 its output.  Each of the six edges is
one of `none` (no connection), `skip_connect` (identity), `nor_conv_1x1`,
`nor_conv_3x3` (ReLU → conv → BN) or `avg_pool_3x3` (stride 1): 5^6 = 15,625 cells.

Skeleton (the spec's keys; NB201 uses C = 16, N = 5, three stages):

    stem        3×3 conv to C channels → BN
    stage s     N cells at C·2^s channels; between stages a residual reduction block:
                ReLU → 3×3 conv stride 2 → BN → ReLU → 3×3 conv → BN, plus the shortcut
                2×2 avg pool stride 2 → 1×1 conv
    classifier  BN → ReLU → global average pool → linear

Layer list (`to_layers`) conventions: a `conv` layer with `fn` "relu" stands for one
ReLU-conv-BN unit; batch norm is folded into the conv and the unit's one ReLU is fused
into it.  (NB201 applies the ReLU to the conv's input; a runtime fuses it into the
producer where it can.  Either way a unit is one conv pass plus one activation.)  A
`skip_connect` or `none` edge emits nothing; a node summing k > 1 edges that are not
`none` emits k - 1 `add` layers.  The classifier's BN + ReLU is one `act` layer (`fn`
"relu"; the BN's per-channel scale and shift are folded into it).

An op whose output reaches the cell output only through `none` edges computes a value
nobody uses.  The spec's `unused_ops` says what the deployed network does with it:
`run` (default) emits it, as NB201's PyTorch network runs it - the multiply-accumulate
count then equals NAS-Bench-201's published FLOPs, and HW-NAS-Bench's fpga and eyeriss
latencies were measured so; `drop` leaves it out, as a graph compiler's dead-code
elimination does; `lone-convs` leaves it out except where an unused node is the output
of one conv edge (its other inputs `none`): that conv still runs, with what it reads -
unless node 1 is such a node and node 2, also unused, has an input of its own: then
neither runs, except where node 2's one input is a conv reading node 1 (then both run).
HW-NAS-Bench's pixel3 and raspi4 latencies follow `lone-convs`: fitted from 1000 cells,
its cross-validated error is 10.7-10.8% against 13.6-13.9% for `drop` (21-23% where every
lone conv runs), and on the 648 cells it counts differently from `drop` the median error
is -6.5% and -2.4% against -33% and -41% (benchmarks/nb201_latency.py, nb201_prior.py).
`build` follows the same choice.

Architectures can be read and written as NB201 strings,
`|op~0|+|op~0|op~1|+|op~0|op~1|op~2|` (node 1 | node 2 | node 3, `~i` the source node),
with `parse_arch` and `format_arch`, so benchmark tables key straight onto the space.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import UsageError
from ..hardware.layers import LayerSpec
from .base import Arch, SearchSpace, Variable

OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
NODES = 4  # node 0 is the cell input, node 3 its output
EDGES = tuple((j, i) for j in range(1, NODES) for i in range(j))  # NB201 string order
STRING_FORMAT = "|op~0|+|op~0|op~1|+|op~0|op~1|op~2|"
_CONV_KERNEL = {"nor_conv_1x1": 1, "nor_conv_3x3": 3}


def edge_knob(j: int, i: int) -> str:
    return f"edge_{j}_{i}"


class Nb201Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    description: str = ""
    channels: int = Field(default=16, gt=0)        # C: stem and first-stage width, doubled per stage
    cells_per_stage: int = Field(default=5, gt=0)  # N
    stages: int = Field(default=3, gt=0)
    ops: list[str] = Field(default=list(OPS), min_length=1)
    unused_ops: Literal["run", "drop", "lone-convs"] = "run"
    input_shape: tuple[int, int, int] = (3, 32, 32)  # what the benchmark tables were measured at
    classes: int = Field(default=10, gt=0)

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, v: list[str]) -> list[str]:
        bad = [op for op in v if op not in OPS]
        if bad:
            raise ValueError(f"unknown op(s) {bad}; allowed: {list(OPS)}")
        if len(set(v)) != len(v):
            raise ValueError("ops must not repeat")
        return v


class Nb201Space(SearchSpace):
    """Knobs `edge_j_i` (node j ← node i) for (j, i) in 1←0, 2←0, 2←1, 3←0, 3←1, 3←2;
    each one of the spec's `ops`."""

    def __init__(self, spec: Nb201Spec):
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self._variables = tuple(Variable(edge_knob(j, i), tuple(spec.ops)) for j, i in EDGES)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Nb201Space:
        return cls(Nb201Spec.model_validate(data))

    def variables(self) -> tuple[Variable, ...]:
        return self._variables

    # -- NB201 strings ---------------------------------------------------------------
    def parse_arch(self, text: str) -> dict:
        """A JSON architecture, or an NB201 string `|op~0|+|op~0|op~1|+|op~0|op~1|op~2|`."""
        text = text.strip()
        if not text.startswith("|"):
            return super().parse_arch(text)
        nodes = [[t.split("~") for t in node.split("|")] for node in text[1:-1].split("|+|")]
        sources = [[t[1] if len(t) == 2 else None for t in node] for node in nodes]
        ops = [t[0] for node in nodes for t in node]
        if not text.endswith("|") or sources != [[str(i) for i in range(j)] for j in range(1, NODES)] \
                or any(op not in self.spec.ops for op in ops):
            raise UsageError(f"'{text}' is not an NB201 architecture string of space '{self.name}'; "
                             f"expected {STRING_FORMAT} with each op one of: {', '.join(self.spec.ops)}")
        return dict(zip((edge_knob(j, i) for j, i in EDGES), ops))

    def format_arch(self, arch: Arch) -> str:
        """The NB201 string of `arch`."""
        arch = self.validate(arch)
        return "|" + "|+|".join("|".join(f"{arch[edge_knob(j, i)]}~{i}" for i in range(j))
                                for j in range(1, NODES)) + "|"

    # -- structure -------------------------------------------------------------------
    def is_degenerate(self, arch: Arch) -> bool:
        """True when every path from the cell input to its output crosses a `none` edge:
        the cell outputs zeros and the network ignores its input."""
        arch = self.validate(arch)
        reached = {0}
        for j in range(1, NODES):
            if any(i in reached and arch[edge_knob(j, i)] != "none" for i in range(j)):
                reached.add(j)
        return NODES - 1 not in reached

    def cell_edges(self, arch: Arch) -> list[tuple[int, int, str]]:
        """The edges (j, i, op) the cell computes, NB201 order: every edge but `none`; with
        `unused_ops: drop`, not those into a node that reaches the output only through
        `none` edges; with `lone-convs`, not those either, except the conv of an unused
        node fed by that conv alone (module docstring)."""
        arch = self.validate(arch)
        kept = {NODES - 1}
        for i in reversed(range(1, NODES - 1)):
            if self.spec.unused_ops == "run" or any(j in kept and arch[edge_knob(j, i)] != "none"
                                                    for j in range(i + 1, NODES)):
                kept.add(i)
            elif self.spec.unused_ops == "lone-convs" and self._lone_conv_runs(arch, i, kept):
                kept.add(i)
        return [(j, i, arch[edge_knob(j, i)]) for j, i in EDGES if j in kept and arch[edge_knob(j, i)] != "none"]

    @staticmethod
    def _lone_conv_runs(arch: Arch, i: int, kept: set[int]) -> bool:
        """`lone-convs`: whether unused node i (1 or 2 of a 4-node cell; `kept`: the nodes
        after it that run) runs its one conv input."""
        inputs = [k for k in range(i) if arch[edge_knob(i, k)] != "none"]
        if len(inputs) != 1 or arch[edge_knob(i, inputs[0])] not in _CONV_KERNEL:
            return False
        lone_first = arch[edge_knob(1, 0)] in _CONV_KERNEL and all(
            arch[edge_knob(j, 1)] == "none" for j in range(2, NODES))  # node 1: an unused lone conv
        if i == 2:  # node 2's conv reads node 0 beside such a node 1: neither runs
            return not (inputs == [0] and lone_first)
        # node 1, with node 2 unused (its conv reading node 1 would have kept node 1 already)
        return 2 in kept or all(arch[edge_knob(2, k)] == "none" for k in range(2))

    def default_input(self) -> tuple[tuple[int, int, int], int]:
        return tuple(self.spec.input_shape), self.spec.classes

    def _check_input(self, input_shape: tuple[int, int, int]) -> None:
        _, h, w = input_shape
        scale = 2 ** (self.spec.stages - 1)
        if h % scale or w % scale:
            raise UsageError(f"space '{self.name}': input {h}x{w} must be divisible by {scale} "
                             f"(its {self.spec.stages} stages halve it {self.spec.stages - 1} times)")

    def to_layers(self, arch: Arch, input_shape: tuple[int, int, int], classes: int) -> list[LayerSpec]:
        self._check_input(input_shape)
        edges = self.cell_edges(arch)
        ch, h, w = input_shape
        layers: list[LayerSpec] = []

        def emit(op, cin, cout, in_hw, out_hw, kernel=1, stride=1, fn="", name="", bias=True):
            kernel = (kernel, kernel) if isinstance(kernel, int) else kernel
            layers.append(LayerSpec(op, cin, cout, in_hw, out_hw, kernel, stride, fn=fn, name=name, bias=bias))

        c = self.spec.channels
        emit("conv", ch, c, (h, w), (h, w), 3, name="stem")
        for s in range(self.spec.stages):
            if s:
                hw, out = (h // 2, w // 2), 2 * c
                emit("conv", c, out, (h, w), hw, 3, 2, "relu", f"reduce{s}.conv_a")
                emit("conv", out, out, hw, hw, 3, 1, "relu", f"reduce{s}.conv_b")
                emit("pool", c, c, (h, w), hw, 2, 2, "avg", f"reduce{s}.shortcut.pool")
                emit("conv", c, out, hw, hw, 1, name=f"reduce{s}.shortcut.conv", bias=False)  # no BN after it
                emit("add", out, out, hw, hw, name=f"reduce{s}.add")
                (h, w), c = hw, out
            for n in range(self.spec.cells_per_stage):
                for j in range(1, NODES):
                    inputs = [(i, op) for jj, i, op in edges if jj == j]
                    for i, op in inputs:
                        name = f"stage{s}.cell{n}.edge_{j}_{i}"
                        if op in _CONV_KERNEL:
                            emit("conv", c, c, (h, w), (h, w), _CONV_KERNEL[op], 1, "relu", name)
                        elif op == "avg_pool_3x3":
                            emit("pool", c, c, (h, w), (h, w), 3, 1, "avg", name)
                    for k in range(len(inputs) - 1):
                        emit("add", c, c, (h, w), (h, w), name=f"stage{s}.cell{n}.node{j}.add{k}")
        emit("act", c, c, (h, w), (h, w), fn="relu", name="lastact")
        emit("pool", c, c, (h, w), (1, 1), (h, w), 1, "avg", "global_pool")
        emit("linear", c, classes, (1, 1), (1, 1), name="classifier")
        return layers

    def build(self, arch: Arch, input_shape: tuple[int, int, int], classes: int):
        """NB201's TinyNetwork for `arch` (see `nasctl.spaces.nb201_torch`)."""
        from .nb201_torch import Nb201Net

        self._check_input(input_shape)
        edges = [(edge_knob(j, i), j, i, op) for j, i, op in self.cell_edges(arch)]
        spec = self.spec
        return Nb201Net(edges, NODES, input_shape, classes, channels=spec.channels, stages=spec.stages,
                        cells_per_stage=spec.cells_per_stage)
