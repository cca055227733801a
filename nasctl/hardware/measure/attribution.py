"""In-context kernel times: profiling context networks and attributing node times to layers.

Each network runs with `SessionOptions.enable_profiling`; the per-node kernel times
onnxruntime records (minimum over the profiled runs) are summed per tag - a node
onnxruntime adds counts for the kernel before it, a node it fused from several kernels
for those of them that ran no node of their own, and a layout reorder (into or out of
its blocked channel layout) for none - and go to the layers the ONNX importer
(`nasctl.hardware.onnx_import`) reads from the network.

Each network is also timed end to end, without profiling.  The run overhead and the
profiler's own cost per node (a few microseconds) are fitted to those times, and the
latter is taken off every profiled node; then each network's profiled kernel times are
scaled to add up to its end-to-end time (with the run overhead and the long kernels
timed alone), so a kernel's cost is its share of a run without the profiler.  The
network's layout reorders are shared so too: a reorder is there for a pair of kernels
that run in different layouts (a conv in the blocked layout, a concat or transpose that
is not), and counted for either one, that kernel's rows would depend on its neighbours.
A depthwise conv followed by a reorder in one network and by another blocked conv in the
next was priced from both: 1.6-2.2x its time in a MobileNetV2.

The profiler's clock is the wall clock: on a busy machine a kernel longer than the OS's
time slice is profiled with time other processes got.  So kernels that profile longer
than 0.5 ms are cut out of their network and timed again alone, with the thread clock,
less the run overhead and the layout reorders around them.

The measuring itself (profiling, timing, the long kernels alone, chunks) is `runner`'s,
the module a profiling bundle (`nasctl hw bundle`) carries to its target; this module
gives what it measured to the layers.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..layers import LayerSpec
from . import runner
from .runner import Network, NetworkTimes, Protocol


@dataclass
class MeasuredNetwork:
    """One context network: its layers (as the importer reads it), each layer's in-context
    time from the profile, and its end-to-end time."""

    description: str
    layers: list[LayerSpec]
    layer_ms: list[float]
    layer_nodes: list[float]  # onnxruntime nodes each layer's time was summed over
    latency_ms: float
    # Long kernels timed alone: layer index -> (end-to-end ms, profiled ms and count of the
    # nodes onnxruntime ran besides the kernel: before it, e.g. a layout reorder of its
    # input, and a layout reorder of its output; in profiles measured before the latter
    # was told apart, the nodes before it only).
    alone: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    energy_mj: Optional[float] = None  # energy of one run, where the machine has energy counters
    # The profiled nodes' times (name, ms, in execution order) the layers' times were
    # attributed from: a refit attributes them again as the code then does (`reattributed`).
    # Empty for networks measured before they were kept.
    nodes: list[tuple[str, float]] = field(default_factory=list)
    # The layout reorders onnxruntime runs in it (`ImportResult.layouts`: per vector width);
    # None where not known (networks measured before they were kept, and not built again):
    # their reorders' time is then shared among the kernels.
    layouts: Optional[dict] = None

    def reattributed(self) -> "MeasuredNetwork":
        """The network with its layers' times attributed again from its profiled nodes
        (`attribute`), where it keeps them; else as it is."""
        if not self.nodes:
            return self
        from dataclasses import replace

        layer_ms, layer_nodes = attribute(self.nodes, self.layers)
        return replace(self, layer_ms=layer_ms, layer_nodes=layer_nodes)

    def to_dict(self) -> dict:
        """Plain JSON data (layers as kernel-table rows, with their names)."""
        from ..lut import row_from_layer

        return {"description": self.description,
                "layers": [{**row_from_layer(l, 0.0), "name": l.name} for l in self.layers],
                "layer_ms": list(map(float, self.layer_ms)), "layer_nodes": list(map(float, self.layer_nodes)),
                "latency_ms": float(self.latency_ms), "alone": {str(j): list(v) for j, v in self.alone.items()},
                "energy_mj": self.energy_mj, "nodes": [[name, float(ms)] for name, ms in self.nodes],
                **({} if self.layouts is None else {"layouts": layout_rows(self.layouts)})}

    @classmethod
    def from_dict(cls, d: dict) -> "MeasuredNetwork":
        from dataclasses import replace

        from ..lut import layer_from_row

        return cls(d["description"], [replace(layer_from_row(r), name=r.get("name", "")) for r in d["layers"]],
                   d["layer_ms"], d["layer_nodes"], d["latency_ms"],
                   {int(j): tuple(v) for j, v in d.get("alone", {}).items()}, d.get("energy_mj"),
                   [(str(name), float(ms)) for name, ms in d.get("nodes", [])],
                   None if "layouts" not in d else layout_from_rows(d["layouts"]))


def layout_rows(layouts: dict) -> dict:
    """Layout reorders per vector width as plain JSON: {width: [[kind, shape, layer, replaces], ...]}."""
    return {str(block): [[r.kind, list(r.shape), int(r.layer), bool(r.replaces)] for r in rs]
            for block, rs in layouts.items()}


def layout_from_rows(rows: dict) -> dict:
    from ..layout import Reorder

    return {int(block): [Reorder(str(kind), "", tuple(int(d) for d in shape), int(layer), bool(replaces))
                         for kind, shape, layer, replaces in rs] for block, rs in rows.items()}


def attribute(nodes: list[tuple[str, float]], layers: Sequence[LayerSpec]) -> tuple[list[float], list[float]]:
    """Each layer's share of the profiled node times, and of the nodes (`runner.attribute`,
    by the kernel tags and node numbers the layers' names carry)."""
    return runner.attribute(nodes, layer_tags(layers), layer_numbers(layers))


def layer_tags(layers: Sequence[LayerSpec]) -> list[Optional[int]]:
    return [runner.tag_of(layer.name) for layer in layers]


def layer_numbers(layers: Sequence[LayerSpec]) -> list[Optional[int]]:
    return [runner.node_number(layer.name) for layer in layers]


def measured_network(description: str, layers: list[LayerSpec], times: NetworkTimes,
                     long_kernel_ms: float = 0.5, layouts: Optional[dict] = None) -> MeasuredNetwork:
    """A network's layers with their shares of what was measured of it (`times`): the
    profiled node times attributed to them, and the long kernels' times alone; `layouts`
    its layout reorders (`MeasuredNetwork.layouts`)."""
    tags = layer_tags(layers)
    layer_ms, layer_nodes = runner.attribute(times.nodes, tags, layer_numbers(layers))
    alone = {j: times.alone[tag] for tag, js in runner.long_kernels(layer_ms, tags, floats(layers),
                                                                      long_kernel_ms).items()
             if tag in times.alone for j in js}
    return MeasuredNetwork(description, layers, layer_ms, layer_nodes, times.latency_ms, alone, times.energy_mj,
                           list(times.nodes), layouts)


def floats(layers: Sequence[LayerSpec]) -> list[bool]:
    return [layer.w_bits == 32 for layer in layers]


# Op types onnxruntime runs an int8 kernel's fused QDQ group as: one integer kernel.
INTEGER_OP = re.compile(r"^(Nhwc)?Q[A-Z]|Integer|^DynamicQuantizeMatMul$|^MatMulNBits$")
# Op types that tell nothing of a kernel's fusion: the quantization nodes themselves, data
# movement and the ops onnxruntime runs on int8 values under their float name (a QDQ
# group around them fused by dropping the Q/DQ nodes).
UNTELLING_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Transpose", "Reshape", "Flatten", "Squeeze",
    "Unsqueeze", "Identity", "ReorderInput", "ReorderOutput", "Resize", "Split", "Slice", "Gather", "MaxPool",
    "NhwcMaxPool", "Pad", "Tile", "Expand", "DepthToSpace", "SpaceToDepth", "Shape", "Cast"})


def fusion_in_profile(layers: Sequence[LayerSpec], ops: dict[str, str]) -> list[Optional[bool]]:
    """Per layer, whether the profiled run ran it dequantized, from the op types of the
    nodes of its kernel tag (`ops`: node name -> op type, `NetworkTimes.ops`): a quantized
    kernel with an integer op among them (QLinearConv, QGemm, ConvInteger, ...) ran fused,
    one with float compute ops only (Conv, Add, LayerNormalization, ... between
    DequantizeLinear and QuantizeLinear) ran dequantized.  None where the profile cannot
    tell (not a quantized kernel; none of its tag's nodes profiled with a telling op type;
    a tag of several quantized layers with both)."""
    from ..onnx_import import _quantized_kernel

    integer: dict[int, bool] = {}
    floating: dict[int, bool] = {}
    for name, op in ops.items():
        tag = runner.tag_of(name)
        if tag is None or op in UNTELLING_OPS:
            continue
        if INTEGER_OP.search(op):
            integer[tag] = True
        else:
            floating[tag] = True
    tags = layer_tags(layers)
    quantized = [_quantized_kernel(layer) for layer in layers]
    sharing = Counter(t for t, q in zip(tags, quantized) if q and t is not None)
    found: list[Optional[bool]] = []
    for tag, q in zip(tags, quantized):
        if not q or tag is None or not (integer.get(tag) or floating.get(tag)):
            found.append(None)
        elif integer.get(tag) and (sharing[tag] == 1 or not floating.get(tag)):
            found.append(False)  # a float op beside the integer one: its bias add, its activation
        elif not integer.get(tag):
            found.append(True)
        else:
            found.append(None)
    return found


def _kernel_alone(model, tag: str):
    """The subgraph of a context network that is one kernel (its tagged nodes), with the
    tensors it reads as inputs."""
    from onnx import utils

    mine = [n for n in model.graph.node if n.name.startswith(tag)]
    made = {o for n in mine for o in n.output}
    consts = {i.name for i in model.graph.initializer}
    inputs = list(dict.fromkeys(i for n in mine for i in n.input if i and i not in made and i not in consts))
    used_outside = {i for n in model.graph.node if not n.name.startswith(tag) for i in n.input}
    used_outside |= {o.name for o in model.graph.output}
    outputs = [o for o in made if o in used_outside] or [mine[-1].output[0]]
    return utils.Extractor(model).extract_model(inputs, outputs)


def tagged_by_kernel(model):
    """A copy of an ONNX model (any model, not a context network) whose nodes and the
    tensors they write are named as a context network's are (`runner.TAG`, `runner.NODE`),
    so that its profiled node times can be attributed to the layers the importer reads from
    it (`attribute`): each node a kernel tag of its own, except that a DequantizeLinear
    takes the tag of the node it feeds and a QuantizeLinear that of the node it quantizes
    (a QDQ group is one kernel, as onnxruntime fuses it).  Graph inputs and weights keep
    their names; a model with subgraphs (If, Loop, Scan) is refused (ValueError)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = list(copy.graph.node)
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute):
        raise ValueError("a model with subgraphs (If, Loop, Scan) cannot be broken down by kernel")
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            readers.setdefault(name, []).append(i)
    tag: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            tag[i] = len(tag)
    spare = len(tag)  # a Q/DQ node with no kernel to join
    for op in ("QuantizeLinear", "DequantizeLinear"):  # a model's last DequantizeLinear joins its Q's kernel
        for i, n in enumerate(nodes):
            if n.op_type != op:
                continue
            joined = [j for j in readers.get(n.output[0], []) if j in tag] if op == "DequantizeLinear" else []
            if not joined and producer.get(n.input[0]) in tag:
                joined = [producer[n.input[0]]]
            tag[i] = tag[joined[0]] if joined else spare
    renamed: dict[str, str] = {}
    for i, n in enumerate(nodes):
        stem = f"k{tag[i]}:{re.sub('[^A-Za-z]', '', n.op_type).lower() or 'op'}_{i}"
        n.name = stem
        for j, out in enumerate(n.output):
            if out:
                renamed[out] = n.output[j] = f"{stem}_{j}"
    for n in nodes:
        for j, name in enumerate(n.input):
            if name in renamed:
                n.input[j] = renamed[name]
    for value in [*copy.graph.output, *copy.graph.value_info]:
        if value.name in renamed:
            value.name = renamed[value.name]
    return copy


def prepare_networks(networks: Sequence[tuple[object, str]], folder: Path) -> tuple[list[Network], list]:
    """Context networks (onnx models with descriptions) written to `folder` to be measured,
    and what the ONNX importer reads of them (`ImportResult`: layers and layout reorders); a
    kernel to be timed alone is cut out of its network when the runner asks for it."""
    from ..onnx_import import import_onnx

    folder.mkdir(parents=True, exist_ok=True)
    prepared, imported = [], []
    for i, (model, _) in enumerate(networks):
        path = folder / f"net{i}.onnx"
        path.write_bytes(model.SerializeToString())
        result = import_onnx(path)

        def alone(tag: int, model=model, stem=path.stem) -> Path:
            kernel = folder / f"{stem}-{tag}.onnx"
            kernel.write_bytes(_kernel_alone(model, f"k{tag}:").SerializeToString())
            return kernel

        prepared.append(Network(path, layer_tags(result.layers), floats(result.layers), alone))
        imported.append(result)
    return prepared, imported


def measure_networks(networks: Sequence[tuple[object, str]], protocol: Protocol, workdir: Path, seed: int = 0,
                     on_round: Optional[Callable[[], None]] = None, long_kernel_ms: float = 0.5) -> list[MeasuredNetwork]:
    """Profile and time a batch of context networks (onnx models with descriptions)
    together (`runner.measure_chunk`).

    Float kernels that profile longer than `long_kernel_ms` are timed again alone with the
    thread clock, for on a busy machine their profiled wall-clock times include time
    slices other processes got (see `in_context_costs`).  Quantized kernels keep their
    profiled times: cut out of their network, onnxruntime no longer fuses their
    quantization into an integer kernel."""
    prepared, imported = prepare_networks(networks, Path(workdir))
    times = runner.measure_chunk(prepared, protocol, workdir, seed, on_round, long_kernel_ms)
    return [measured_network(desc, res.layers, t, long_kernel_ms, res.layouts)
            for (_, desc), res, t in zip(networks, imported, times)]


FLOOR_MS = 1e-4  # the least in-context cost a kernel is given (0.1 µs)


def known_layout(m: MeasuredNetwork, block: Optional[int]) -> list:
    """The network's layout reorders for the vector width `block` where they are known and
    its profile ran as many reorder nodes of each direction as they say (a runtime that lays
    tensors out otherwise did not); else none (`[]`), its reorders' time then shared among
    its kernels."""
    if block is None or not m.layouts or block not in m.layouts or not m.nodes:
        return []
    ran = Counter("in" if name.startswith("ReorderInput") else "out" for name, _ in m.nodes
                  if name.startswith(runner.LAYOUT))
    layout = m.layouts[block]
    return list(layout) if ran == Counter(r.direction for r in layout) else []


def layout_block(measured: Sequence[MeasuredNetwork]) -> tuple[Optional[int], dict[int, int]]:
    """The vector width whose predicted reorders agree with the profiled ones on the most
    networks that ran any (None where none agrees), and the count for each width."""
    from ..layout import BLOCKS

    agree = {b: sum(1 for m in measured if any(n.startswith(runner.LAYOUT) for n, _ in m.nodes)
                    and known_layout(m, b)) for b in BLOCKS}
    best = max(BLOCKS, key=lambda b: (agree[b], b))
    return (best if agree[best] else None), agree


def reorder_times(m: MeasuredNetwork, per_node: float) -> dict[str, float]:
    """The profiled time of the network's layout reorder nodes, per direction, less the
    profiler's cost per node."""
    out = {"in": 0.0, "out": 0.0}
    for name, ms in m.nodes:
        if name.startswith(runner.LAYOUT):
            out["in" if name.startswith("ReorderInput") else "out"] += max(ms - per_node, 0.0)
    return out


def in_context_costs(measured: Sequence[MeasuredNetwork], short_ms: float = 2.0,
                     known: Optional[tuple[float, float]] = None,
                     block: Optional[int] = None, reread: Optional[dict | list[dict]] = None
                     ) -> tuple[list[np.ndarray], dict]:
    """Per-layer costs from the profiles and the thread-clock times.

    The profiler adds its own cost to every node it times; fit `end-to-end = run overhead
    + Σ profiled - per-node cost x nodes` robustly (soft L1) over the short networks (all
    their profiled nodes, the layout reorders no layer is given included) and take the
    per-node cost off every layer.  A long kernel, timed alone, costs its end-to-end time
    less the run overhead and the nodes onnxruntime ran besides it (before it, and a layout
    reorder of its output).  The other kernels of a network are then scaled alike (within
    0.5-2x) so that the network's costs and run overhead add up to its end-to-end time:
    they share its layout reorders in proportion to their times.  Where long kernels take
    most of the network's time, that scale leans on the typical one by the share they
    take.  `known`: the run overhead and the profiler's cost per node as a profile of this
    machine fitted them, taken instead of fitting them to `measured`.  `block`: the vector
    width whose layout reorders are priced on their own (`lut.LayoutCost`): a network whose
    reorders are known for it (`known_layout`) has their time taken off before its kernels
    are scaled.  `reread`: what layers of a few rows pay for reading their weights from
    memory (`lut.WeightStream`s as `overhead.weight_reread` holds them): a long one's alone
    time, weights in the caches, leaves it out, so its cost is that time and what it pays at
    the curve's resident rate, and what it pays beyond counts with them towards the
    network's time; a profiled one's time (which holds it) has what it pays beyond the
    resident rate taken off once scaled - the kernels' costs are then what they cost in a
    network whose weights stay in the caches, as the table holds them."""
    from scipy.optimize import least_squares

    from ..lut import WeightStream, weight_bytes

    y = np.array([m.latency_ms for m in measured])
    S = np.array([sum(ms for _, ms in m.nodes) if m.nodes else sum(m.layer_ms) for m in measured])
    N = np.array([len(m.nodes) if m.nodes else sum(m.layer_nodes) for m in measured])
    fit_on = (y < short_ms) & np.array([not m.alone for m in measured])
    if fit_on.sum() < 3:
        fit_on[:] = True
    c0, per_node = known if known is not None else least_squares(
        lambda p: (p[0] + S[fit_on] - p[1] * N[fit_on]) / y[fit_on] - 1, [0.01, 0.001],
        loss="soft_l1", f_scale=0.05, bounds=([0, 0], [np.inf, np.inf])).x
    c0 = float(min(c0, 0.5 * y.min()))
    costs, scales, found = [], [], []
    streams = [WeightStream(**r) for r in ([] if reread is None else reread if isinstance(reread, list) else [reread])]
    for m in measured:
        t = np.maximum(np.array(m.layer_ms) - per_node * np.array(m.layer_nodes), FLOOR_MS)
        weights = weight_bytes(m.layers) if streams else 0.0
        extra = np.array([sum(s.extra_ms(layer, weights) for s in streams) for layer in m.layers] if streams
                         else np.zeros(len(t)))
        alone = np.zeros(len(t), dtype=bool)
        for j, (ms, boundary_ms, boundary_nodes) in m.alone.items():
            # (with what a layer of a few rows pays at the resident rate in any network, which
            # its time alone, weights in the caches, leaves out, as a profiled one's holds it)
            t[j] = max(ms - c0 - (boundary_ms - per_node * boundary_nodes), FLOOR_MS) + sum(
                s.resident_ms(m.layers[j]) for s in streams)
            alone[j] = True
        # The profiled kernels' times, scaled so that with the long kernels timed alone and
        # the run overhead they add up to the network's end-to-end time (measured without
        # the profiler): what the profile gives is each kernel's share of it.
        rest = t[~alone].sum()
        # Where the network's layout reorders are known, they are priced on their own
        # (`lut.LayoutCost`): their time is no kernel's.
        reorders = sum(reorder_times(m, per_node).values()) if known_layout(m, block) else 0.0
        long_ms = t[alone].sum() + extra[alone].sum()
        k = float(np.clip((m.latency_ms - c0 - reorders - long_ms) / rest, 0.5, 2.0)) if rest > 0 else None
        found.append((t, alone, k, max(0.0, 1.0 - long_ms / max(m.latency_ms - c0, FLOOR_MS)), extra))
    # Where the long kernels timed alone take most of a network's time, what its other
    # kernels are scaled by is a small difference of two large times, each measured to a
    # few percent: in two profiles of the same networks it moved by 28% or more for one in
    # ten of those whose long kernels took 80% or more.  So a network's scale leans, by the
    # share of its time the long kernels leave, on the typical one: the median over the
    # networks without long kernels (1, the profiled times as they are, where every
    # network has some, as a few models broken down by kernel may).
    plain = [k for (_, alone, k, _, _) in found if k is not None and not alone.any()]
    typical = float(np.median(plain)) if plain else 1.0
    for t, alone, k, share, extra in found:
        if k is not None:
            k = float(np.exp(share * np.log(k) + (1.0 - share) * np.log(typical)))
            t[~alone] *= k
            scales.append(k)
        # (at most four fifths of a profiled layer's time, as `profile.resident_costs` takes)
        t[~alone] = np.maximum(t[~alone] - extra[~alone], 0.2 * t[~alone])
        costs.append(np.maximum(t, FLOOR_MS))
    return costs, {"run_overhead_ms": c0, "profiler_cost_per_node_ms": float(per_node),
                   "kernels_timed_alone": sum(len(m.alone) for m in measured),
                   "profiled_times_scaled_by": {q: round(float(np.quantile(scales, v)), 4) if scales else 1.0
                                                for q, v in (("p10", 0.1), ("median", 0.5), ("p90", 0.9))}}
