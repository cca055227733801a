"""In-context kernel times: profiling context networks and attributing node times to layers.

Each network runs with `SessionOptions.enable_profiling`; the per-node kernel times
onnxruntime records (minimum over the profiled runs) are summed per tag - a node
onnxruntime adds, like a layout reorder, counts for the kernel before it, and a node it
fused from several kernels for those of them that ran no node of their own - and go to
the layers the ONNX importer (`nasctl.hardware.onnx_import`) reads from the network.

Each network is also timed end to end, without profiling.  The run overhead and the
profiler's own cost per node (a few microseconds) are fitted to those times, and the
latter is taken off every profiled node; then each network's profiled kernel times are
scaled to add up to its end-to-end time (with the run overhead and the long kernels
timed alone), so a kernel's cost is its share of a run without the profiler.

The profiler's clock is the wall clock: on a busy machine a kernel longer than the OS's
time slice is profiled with time other processes got.  So kernels that profile longer
than 0.5 ms are cut out of their network and timed again alone, with the thread clock,
less the run overhead and the layout reorders around them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..layers import LayerSpec
from .context import TAG
from .timing import Protocol, energy_counters, energy_per_run_mj, interleaved_min, make_session, random_feed


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
    # nodes onnxruntime ran before the kernel, e.g. a layout reorder of its input).
    alone: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    energy_mj: Optional[float] = None  # energy of one run, where the machine has energy counters

    def to_dict(self) -> dict:
        """Plain JSON data (layers as kernel-table rows, with their names)."""
        from ..lut import row_from_layer

        return {"description": self.description,
                "layers": [{**row_from_layer(l, 0.0), "name": l.name} for l in self.layers],
                "layer_ms": list(map(float, self.layer_ms)), "layer_nodes": list(map(float, self.layer_nodes)),
                "latency_ms": float(self.latency_ms), "alone": {str(j): list(v) for j, v in self.alone.items()},
                "energy_mj": self.energy_mj}

    @classmethod
    def from_dict(cls, d: dict) -> "MeasuredNetwork":
        from dataclasses import replace

        from ..lut import layer_from_row

        return cls(d["description"], [replace(layer_from_row(r), name=r.get("name", "")) for r in d["layers"]],
                   d["layer_ms"], d["layer_nodes"], d["latency_ms"],
                   {int(j): tuple(v) for j, v in d.get("alone", {}).items()}, d.get("energy_mj"))


def _node_times(profile_file: str) -> list[tuple[str, float]]:
    """(node name, minimum kernel time in ms over the profiled runs), in execution order."""
    with open(profile_file, encoding="utf-8") as f:
        events = json.load(f)
    best: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            best[name] = min(best.get(name, np.inf), e["dur"] / 1e3)
    return list(best.items())


def attribute(nodes: list[tuple[str, float]], layers: Sequence[LayerSpec]) -> tuple[list[float], list[float]]:
    """Each layer's share of the profiled node times, and of the nodes.

    A node whose name carries a kernel tag counts for that kernel.  An untagged node
    (one onnxruntime made) stands in for the kernels it replaced - the tagged kernels
    between its tagged neighbours that ran no node of their own (e.g. an add and a layer
    norm fused into one SkipLayerNormalization) - or, if there are none, counts for the
    kernel before it (layout reorders and reshapes around a kernel).  A kernel's time
    goes to its layer; a kernel without a layer (a reshape) passes its time to the layer
    before it."""
    tags = [int(m.group(1)) if (m := TAG.search(name)) else None for name, _ in nodes]
    seen = {t for t in tags if t is not None}
    per_tag: dict[int, list[float]] = {}

    def add(tag: int, ms: float, share: float) -> None:
        acc = per_tag.setdefault(tag, [0.0, 0.0])
        acc[0] += ms * share
        acc[1] += share

    for i, ((_, ms), tag) in enumerate(zip(nodes, tags)):
        if tag is None:
            before = next((t for t in reversed(tags[:i]) if t is not None), None)
            after = next((t for t in tags[i + 1:] if t is not None), None)
            lo, hi = (before or 0), (after if after is not None else max(seen, default=0) + 1)
            replaced = [t for t in range(min(lo, hi) + 1, max(lo, hi)) if t not in seen]
            if replaced:
                for t in replaced:
                    add(t, ms, 1 / len(replaced))
                continue
            tag = before if before is not None else after
            if tag is None:
                continue
        add(tag, ms, 1.0)
    layer_tags = [int(m.group(1)) if (m := TAG.search(layer.name)) else None for layer in layers]
    times, counts = [0.0] * len(layers), [0.0] * len(layers)
    owners = sorted((t, i) for i, t in enumerate(layer_tags) if t is not None)
    for tag, (ms, n) in per_tag.items():
        mine = [i for t, i in owners if t == tag]
        if not mine:  # no layer of its own: the nearest layer before it
            earlier = [i for t, i in owners if t < tag]
            mine = [earlier[-1]] if earlier else ([owners[0][1]] if owners else [])
        for i in mine:
            times[i] += ms / len(mine)
            counts[i] += n / len(mine)
    return times, counts


def _time_together(paths: Sequence[Path], protocol: Protocol, workdir: Path, rng: np.random.Generator,
                   on_round: Optional[Callable[[], None]] = None, energy: bool = False):
    """Profile and time models together: each one's node times (profiled sessions) and
    end-to-end time (plain sessions), both by the interleaved protocol; with `energy`,
    also each one's energy per run (mJ) from the RAPL counters, else None."""
    feeds, runs, sessions = [], [], []
    for i, path in enumerate(paths):
        sess = make_session(path, protocol.threads, str(workdir / f"{Path(path).stem}-prof{i}"))
        feeds.append(random_feed(sess, rng))
        sessions.append(sess)
        runs.append(lambda s=sess, f=feeds[-1]: s.run(None, f))
    interleaved_min(runs, protocol, on_round)
    nodes = [_node_times(s.end_profiling()) for s in sessions]
    del sessions[:], runs[:]  # free the profiled sessions before opening the plain ones
    for path, feed in zip(paths, feeds):
        sess = make_session(path, protocol.threads)
        runs.append(lambda s=sess, f=feed: s.run(None, f))
    latency = interleaved_min(runs, protocol, on_round)
    return nodes, latency, ([energy_per_run_mj(run) for run in runs] if energy else None)


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


def measure_networks(networks: Sequence[tuple[object, str]], protocol: Protocol, workdir: Path, seed: int = 0,
                     on_round: Optional[Callable[[], None]] = None, long_kernel_ms: float = 0.5) -> list[MeasuredNetwork]:
    """Profile and time a batch of context networks (onnx models with descriptions).

    Float kernels that profile longer than `long_kernel_ms` are timed again alone with the
    thread clock, for on a busy machine their profiled wall-clock times include time
    slices other processes got (see `in_context_costs`).  Quantized kernels keep their
    profiled times: cut out of their network, onnxruntime no longer fuses their
    quantization into an integer kernel."""
    from ..onnx_import import import_onnx

    rng = np.random.default_rng(seed)
    paths, imported = [], []
    for i, (model, _) in enumerate(networks):
        path = workdir / f"net{i}.onnx"
        path.write_bytes(model.SerializeToString())
        paths.append(path)
        imported.append(import_onnx(path).layers)
    nodes, latency, energy = _time_together(paths, protocol, workdir, rng, on_round, bool(energy_counters()))
    measured = [MeasuredNetwork(desc, layers, *attribute(n, layers), float(ms))
                for (_, desc), layers, n, ms in zip(networks, imported, nodes, latency)]
    for m, mj in zip(measured, energy or []):
        m.energy_mj = mj
    todo, alone = [], []
    for i, m in enumerate(measured):
        for j, (layer, ms) in enumerate(zip(m.layers, m.layer_ms)):
            tag = TAG.search(layer.name)
            if ms > long_kernel_ms and tag is not None and layer.w_bits == 32:
                path = workdir / f"net{i}-{tag.group(1)}.onnx"
                path.write_bytes(_kernel_alone(networks[i][0], tag.group(0)).SerializeToString())
                todo.append((i, j))
                alone.append(path)
    if alone:
        nodes, latency, _ = _time_together(alone, protocol, workdir, rng, on_round)
        for (i, j), kernel_nodes, ms in zip(todo, nodes, latency):
            # What the runtime runs before the kernel (a layout reorder of its input) belongs
            # to the kernel before it in a network; what runs after counts for the kernel.
            first = next((k for k, (name, _) in enumerate(kernel_nodes) if TAG.search(name)), 0)
            before = [t for _, t in kernel_nodes[:first]]
            measured[i].alone[j] = (float(ms), float(sum(before)), len(before))
    return measured


FLOOR_MS = 1e-4  # the least in-context cost a kernel is given (0.1 µs)


def in_context_costs(measured: Sequence[MeasuredNetwork], short_ms: float = 2.0) -> tuple[list[np.ndarray], dict]:
    """Per-layer costs from the profiles and the thread-clock times.

    The profiler adds its own cost to every node it times; fit `end-to-end = run overhead
    + Σ profiled - per-node cost x nodes` robustly (soft L1) over the short networks and
    take the per-node cost off every layer.  A long kernel, timed alone, costs its
    end-to-end time less the run overhead and the nodes onnxruntime ran before it.  The
    other kernels of a network are then scaled alike (within 0.5-2x) so that the network's
    costs and run overhead add up to its end-to-end time."""
    from scipy.optimize import least_squares

    y = np.array([m.latency_ms for m in measured])
    S = np.array([sum(m.layer_ms) for m in measured])
    N = np.array([sum(m.layer_nodes) for m in measured])
    fit_on = (y < short_ms) & np.array([not m.alone for m in measured])
    if fit_on.sum() < 3:
        fit_on[:] = True
    c0, per_node = least_squares(lambda p: (p[0] + S[fit_on] - p[1] * N[fit_on]) / y[fit_on] - 1, [0.01, 0.001],
                                 loss="soft_l1", f_scale=0.05, bounds=([0, 0], [np.inf, np.inf])).x
    c0 = float(min(c0, 0.5 * y.min()))
    costs, scales = [], []
    for m in measured:
        t = np.maximum(np.array(m.layer_ms) - per_node * np.array(m.layer_nodes), FLOOR_MS)
        alone = np.zeros(len(t), dtype=bool)
        for j, (ms, boundary_ms, boundary_nodes) in m.alone.items():
            t[j] = max(ms - c0 - (boundary_ms - per_node * boundary_nodes), FLOOR_MS)
            alone[j] = True
        # The profiled kernels' times, scaled so that with the long kernels timed alone and
        # the run overhead they add up to the network's end-to-end time (measured without
        # the profiler): what the profile gives is each kernel's share of it.
        rest = t[~alone].sum()
        if rest > 0:
            k = float(np.clip((m.latency_ms - c0 - t[alone].sum()) / rest, 0.5, 2.0))
            t[~alone] *= k
            scales.append(k)
        costs.append(np.maximum(t, FLOOR_MS))
    return costs, {"run_overhead_ms": c0, "profiler_cost_per_node_ms": float(per_node),
                   "kernels_timed_alone": sum(len(m.alone) for m in measured),
                   "profiled_times_scaled_by": {q: round(float(np.quantile(scales, v)), 4) if scales else 1.0
                                                for q, v in (("p10", 0.1), ("median", 0.5), ("p90", 0.9))}}
