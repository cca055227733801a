"""Measuring ONNX networks with onnxruntime: the protocol `nasctl hw profile` measures by,
and the standalone runner of a profiling bundle (`nasctl hw bundle`).

This module imports only the standard library, numpy and onnxruntime: `hw bundle` copies
it verbatim into a bundle as `runner.py`, and on the target machine (a phone, a Jetson,
a Raspberry Pi) it measures the bundle's networks with no nasctl and no torch:

    python runner.py [--threads T] [--rounds R] [--repeats N] [--out results.csv]

`nasctl hw profile` measures with the same functions, so a device fitted from a bundle's
results (`nasctl hw fit --bundle-results FILE`) is what `hw profile` would have built
from the same measurements.

Timing protocol (both for kernels and end to end): sessions run with the requested
number of intra-op threads (default 1) and sequential execution; items are timed
round-robin - each round runs every item a few times and keeps its fastest run - and an
item's time is its minimum over all rounds.  Plain medians drift by ~8% between runs
minutes apart on a shared machine; the interleaved minimum repeats within ~1%.  End to
end, a model is opened in several sessions (`--sessions`, default 3) and takes the median
session's time: one session's buffers can run up to 1.5x slower than another's.  With one
thread onnxruntime computes on the calling thread, so the clock is that thread's CPU
time: the same as wall-clock latency on an idle core, and blind to time the OS gives to
other processes.  With more threads the clock is wall-clock time.

In-context kernel times: each network runs with onnxruntime's profiling, which records
every node's kernel time (the minimum over the profiled runs is kept) and op type (what
this onnxruntime made of each int8 kernel: one integer kernel such as QLinearConv, or the
float op between DequantizeLinear and QuantizeLinear; the fitted device labels the
kernels as the target ran them); each network is also timed end to end without
profiling; kernels whose profiled time is long (their
wall-clock profile may include other processes' time slices) are timed again alone, as
models of their own.  Networks are measured in chunks, and the same small reference
networks run in every chunk, so that a chunk measured while the machine was busier can
be scaled back.  What these times mean for the kernels (`nasctl.hardware.measure.attribution`)
and the device fitted to them (`nasctl.hardware.measure.profile`) are nasctl's.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

TAG = re.compile(r"k(\d+):")  # the tag of a kernel, prefixing its nodes' names in a context network
# A context network's node (or tensor) name: its kernel's tag, then the node's name and its
# number in the network ("k2:sigmoid_4"; its output "k2:sig_4", quantized by "k2:sig_4_QuantizeLinear").
NODE = re.compile(r"k(\d+):[A-Za-z]+_(\d+)")

BUNDLE_FORMAT = 1  # bundle.json
RESULTS_FORMAT = 2  # the results CSV (2: the op type of each profiled node)
BUNDLE_FILE = "bundle.json"
RESULTS_FILE = "results.csv"
RESULTS_COLUMNS = ("record", "chunk", "network", "name", "value", "count", "op")


class InputError(ValueError):
    """Input the runner cannot measure (a bundle it cannot read, a model input it cannot
    feed): one line for the user."""


@dataclass(frozen=True)
class Protocol:
    """How items are timed; recorded in the device spec's `measurement:` section."""

    threads: int = 1
    rounds: int = 15
    repeats: int = 3
    warmup: int = 2
    # The rounds are paced to span at least this many seconds of wall time (a pause after
    # a round that ended early): a busy spell of the machine shorter than that cannot reach
    # every round, so the minimum escapes it.  Unpaced, the 15 rounds of a few small
    # models last a fraction of a second, and a spell of a second slows every round.
    spread_s: float = 0.0
    # End to end, each model is opened in this many sessions (timed interleaved with the
    # rest) and its time is the median session's: on a shared machine one session's buffers
    # can run up to 1.5x slower than another's for the whole of a measurement, and a model
    # runs in the session it gets - the median is the typical one, not the luckiest.
    sessions: int = 1

    @property
    def clock(self) -> str:
        return "thread_cpu" if self.threads == 1 else "wall"

    def describe(self) -> dict:
        return {"threads": self.threads, "rounds": self.rounds, "repeats_per_round": self.repeats,
                "warmup_runs": self.warmup, "clock": self.clock, "rounds_spread_over_s": self.spread_s,
                "sessions_per_model": self.sessions,
                "statistic": "minimum over rounds of the fastest run per round, items interleaved round-robin; "
                             "end to end, the median over each model's sessions",
                "clock_note": ("CPU time of the calling thread (onnxruntime computes on it with one thread): "
                               "wall-clock latency on an idle core, blind to other processes"
                               if self.clock == "thread_cpu" else "wall-clock time")}


def session_options(threads: int, profile_prefix: Optional[str] = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def make_session(model, threads: int, profile_prefix: Optional[str] = None):
    """An onnxruntime CPU session for a model (a path or serialized bytes)."""
    import onnxruntime as ort

    src = str(model) if isinstance(model, (str, Path)) else model
    return ort.InferenceSession(src, session_options(threads, profile_prefix), providers=["CPUExecutionProvider"])


NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
               "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
               "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def random_feed(session, rng: np.random.Generator) -> dict:
    """Seeded inputs for every graph input (a dynamic dim taken as 1)."""
    feed = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = NUMPY_TYPES.get(inp.type)
        if dtype is None:
            raise InputError(f"model input '{inp.name}' has type {inp.type}; nasctl feeds numeric tensors only")
        values = rng.standard_normal(shape)
        feed[inp.name] = (values if np.issubdtype(dtype, np.floating) else np.clip(values, 0, 1)).astype(dtype)
    return feed


def interleaved_min(runs: Sequence[Callable[[], object]], protocol: Protocol,
                    on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """Each run's time (ms) by the protocol: round-robin rounds, fastest of a few repeats
    per round, minimum over rounds; the rounds paced over `protocol.spread_s` seconds."""
    now = time.thread_time_ns if protocol.clock == "thread_cpu" else time.perf_counter_ns
    for run in runs:
        for _ in range(protocol.warmup):
            run()
    best = np.full(len(runs), np.inf)
    start = time.perf_counter()
    for r in range(protocol.rounds):
        for i, run in enumerate(runs):
            for _ in range(protocol.repeats):
                t0 = now()
                run()
                best[i] = min(best[i], now() - t0)
        if on_round is not None:
            on_round()
        if r + 1 < protocol.rounds:  # the next round starts no earlier than its share of the spread
            time.sleep(max(0.0, start + protocol.spread_s * (r + 1) / (protocol.rounds - 1) - time.perf_counter()))
    return best / 1e6


def measure_models(models: Sequence, protocol: Protocol, seed: int = 0,
                   on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """End-to-end latency (ms) of each ONNX model (paths or bytes), measured together: the
    median of its `protocol.sessions` sessions."""
    rng = np.random.default_rng(seed)
    runs, feeds = [], []
    for model in models:
        sess = make_session(model, protocol.threads)
        feeds.append(random_feed(sess, rng))
        runs.append(lambda s=sess, f=feeds[-1]: s.run(None, f))
    return _end_to_end(models, feeds, runs, protocol, on_round)


def _end_to_end(models: Sequence, feeds: Sequence[dict], first: list, protocol: Protocol,
                on_round: Optional[Callable[[], None]] = None) -> np.ndarray:
    """Time the models end to end by the protocol.  `first` runs each model in a session
    of its own; `protocol.sessions - 1` more sessions of each are opened beside them (same
    feeds), and a model's time is the median over its sessions."""
    runs = list(first)
    for _ in range(max(1, protocol.sessions) - 1):
        for model, feed in zip(models, feeds):
            sess = make_session(model, protocol.threads)
            runs.append(lambda s=sess, f=feed: s.run(None, f))
    return np.median(interleaved_min(runs, protocol, on_round).reshape(-1, len(models)), axis=0)


# --- energy ----------------------------------------------------------------------------

def energy_counters() -> list[Path]:
    """Readable RAPL package energy counters (µJ), if the machine exposes any."""
    return [p for p in sorted(Path("/sys/class/powercap").glob("intel-rapl*/energy_uj")) if os.access(p, os.R_OK)]


def read_energy_uj() -> float:
    """The sum of the package energy counters (µJ)."""
    return float(sum(int(p.read_text()) for p in energy_counters()))


def _counter_range_uj() -> float:
    ranges = [p.parent / "max_energy_range_uj" for p in energy_counters()]
    return float(sum(int(r.read_text()) for r in ranges if r.is_file()))


def energy_per_run_mj(run: Callable[[], object], seconds: float = 0.2) -> float:
    """Package energy of one run (mJ): the counters' increase over repeated runs lasting at
    least `seconds` (RAPL updates about every millisecond), per run."""
    start, t0, n = read_energy_uj(), time.perf_counter(), 0
    while n == 0 or time.perf_counter() - t0 < seconds:
        run()
        n += 1
    used = read_energy_uj() - start
    if used < 0:  # a counter wrapped around
        used += _counter_range_uj()
    return used / n / 1e3


# --- in-context kernel times -----------------------------------------------------------

def read_profile(profile_file: str) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """(node name, minimum kernel time in ms over the profiled runs), in execution order,
    and each node's op type as onnxruntime ran it (the profiler's `args.op_name`)."""
    with open(profile_file, encoding="utf-8") as f:
        events = json.load(f)
    best: dict[str, float] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            best[name] = min(best.get(name, np.inf), e["dur"] / 1e3)
            op = (e.get("args") or {}).get("op_name")
            if op:
                ops[name] = str(op)
    return list(best.items()), ops


def tag_of(name: str) -> Optional[int]:
    m = TAG.search(name)
    return int(m.group(1)) if m else None


def node_number(name: str) -> Optional[int]:
    """The number of the context network's node a name comes from (`NODE`), if it tells one."""
    m = NODE.search(name)
    return int(m.group(2)) if m else None


# onnxruntime's nodes moving a tensor into or out of its blocked channel layout (NCHWc):
# they count for no kernel (`attribute`).
LAYOUT = "Reorder"


def attribute(nodes: Sequence[tuple[str, float]], layer_tags: Sequence[Optional[int]],
              layer_numbers: Optional[Sequence[Optional[int]]] = None) -> tuple[list[float], list[float]]:
    """Each layer's share of the profiled node times, and of the nodes, given each layer's
    kernel tag (None for a layer without one) and, optionally, the number of the node it
    was read from (`node_number` of its name).

    A node whose name carries a kernel tag counts for that kernel.  An untagged node
    (one onnxruntime made) stands in for the kernels it replaced - the tagged kernels
    between its tagged neighbours that ran no node of their own (e.g. an add and a layer
    norm fused into one SkipLayerNormalization) - or, if there are none, counts for the
    kernel before it (reshapes around a kernel).  A layout reorder (`LAYOUT`) counts for
    no kernel: the network's kernels share it (`attribution.in_context_costs`).  A
    kernel's time goes to its layer; a kernel without a layer (a reshape) passes its time
    to the layer before it.  A kernel of several layers (an int8 swish: a conv, its
    sigmoid and its product, each quantized) gives each layer the nodes of its own number
    - the layer's node and the quantization of its output - and the rest (its weights'
    and input's dequantization, reorders) in proportion to those; evenly where the
    layers' numbers are not known."""
    tags = [tag_of(name) for name, _ in nodes]
    numbers = [node_number(name) for name, _ in nodes]
    own: dict[tuple[int, int], list[float]] = {}  # (tag, node number) -> [ms, nodes] of that node's own
    seen = {t for t in tags if t is not None}
    per_tag: dict[int, list[float]] = {}

    def add(tag: int, ms: float, share: float) -> None:
        acc = per_tag.setdefault(tag, [0.0, 0.0])
        acc[0] += ms * share
        acc[1] += share

    for i, ((_, ms), tag) in enumerate(zip(nodes, tags)):
        if tag is not None and numbers[i] is not None:
            acc = own.setdefault((tag, numbers[i]), [0.0, 0.0])
            acc[0] += ms
            acc[1] += 1
        if tag is None and nodes[i][0].startswith(LAYOUT):
            continue
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
    times, counts = [0.0] * len(layer_tags), [0.0] * len(layer_tags)
    owners = sorted((t, i) for i, t in enumerate(layer_tags) if t is not None)
    for tag, (ms, n) in per_tag.items():
        mine = [i for t, i in owners if t == tag]
        if not mine:  # no layer of its own: the nearest layer before it
            earlier = [i for t, i in owners if t < tag]
            mine = [earlier[-1]] if earlier else ([owners[0][1]] if owners else [])
        # what each layer ran of its own (several layers of one kernel), and the rest
        direct = [own.get((tag, layer_numbers[i]), [0.0, 0.0]) if len(mine) > 1 and layer_numbers else [0.0, 0.0]
                  for i in mine]
        own_ms, own_n = sum(d[0] for d in direct), sum(d[1] for d in direct)
        for i, (d_ms, d_n) in zip(mine, direct):
            share = d_ms / own_ms if own_ms > 0 else 1 / len(mine)
            times[i] += d_ms + (ms - own_ms) * share
            counts[i] += d_n + (n - own_n) * share
    return times, counts


def long_kernels(layer_ms: Sequence[float], layer_tags: Sequence[Optional[int]], floats: Sequence[bool],
                 long_kernel_ms: float) -> dict[int, list[int]]:
    """The kernels to time again alone: tag -> its layers that profiled longer than
    `long_kernel_ms`.  Float kernels only: cut out of their network, a quantized kernel
    is no longer fused into an integer kernel by onnxruntime."""
    found: dict[int, list[int]] = {}
    for j, (ms, tag, is_float) in enumerate(zip(layer_ms, layer_tags, floats)):
        if ms > long_kernel_ms and tag is not None and is_float:
            found.setdefault(tag, []).append(j)
    return found


def to_time_alone(nodes: Sequence[tuple[str, float]], layer_tags: Sequence[Optional[int]], floats: Sequence[bool],
                  long_kernel_ms: float) -> dict[int, list[int]]:
    """The long kernels (`long_kernels`) of a network profiled as `nodes`, its layers' times
    attributed by their tags alone (a kernel of several layers split evenly): the kernels
    a runner times alone, and those whose times a bundle's results must hold."""
    return long_kernels(attribute(nodes, layer_tags)[0], layer_tags, floats, long_kernel_ms)


@dataclass
class Network:
    """A network to measure: its file, its layers' kernel tags and which of them are float
    kernels, and where to find one of its kernels as a model of its own (`alone(tag)`)."""

    path: Path
    layer_tags: list[Optional[int]]
    floats: list[bool]
    alone: Callable[[int], Path]


@dataclass
class NetworkTimes:
    """What was measured of one network: its profiled nodes' times (ms, in execution
    order), its end-to-end time, its energy per run where the machine has counters, and
    its long kernels timed alone: tag -> (end-to-end ms, profiled ms and count of the
    nodes onnxruntime ran before the kernel, e.g. a layout reorder of its input), and its
    profiled nodes' op types (node name -> op type, as onnxruntime ran them)."""

    nodes: list[tuple[str, float]]
    latency_ms: float
    energy_mj: Optional[float] = None
    alone: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)


def time_together(paths: Sequence[Path], protocol: Protocol, workdir: Path, rng: np.random.Generator,
                  on_round: Optional[Callable[[], None]] = None, energy: bool = False):
    """Profile and time models together: each one's node times and op types (profiled
    sessions, `read_profile`) and end-to-end time (plain sessions), both by the
    interleaved protocol; with `energy`,
    also each one's energy per run (mJ) from the RAPL counters, else None."""
    feeds, runs, sessions = [], [], []
    for i, path in enumerate(paths):
        sess = make_session(path, protocol.threads, str(Path(workdir) / f"{Path(path).stem}-prof{i}"))
        feeds.append(random_feed(sess, rng))
        sessions.append(sess)
        runs.append(lambda s=sess, f=feeds[-1]: s.run(None, f))
    interleaved_min(runs, protocol, on_round)
    profiles = [read_profile(s.end_profiling()) for s in sessions]
    del sessions[:], runs[:]  # free the profiled sessions before opening the plain ones
    for path, feed in zip(paths, feeds):
        sess = make_session(path, protocol.threads)
        runs.append(lambda s=sess, f=feed: s.run(None, f))
    latency = _end_to_end(paths, feeds, runs, protocol, on_round)
    return profiles, latency, ([energy_per_run_mj(run) for run in runs] if energy else None)


def measure_chunk(networks: Sequence[Network], protocol: Protocol, workdir: Path, seed: int = 0,
                  on_round: Optional[Callable[[], None]] = None, long_kernel_ms: float = 0.5,
                  energy: Optional[bool] = None) -> list[NetworkTimes]:
    """Profile and time networks together, then time their long kernels alone (see
    `long_kernels`) together; `energy` (default: where the machine has counters) also
    measures each network's energy per run."""
    rng = np.random.default_rng(seed)
    energy = bool(energy_counters()) if energy is None else energy
    profiles, latency, joules = time_together([n.path for n in networks], protocol, workdir, rng, on_round, energy)
    measured = [NetworkTimes(nd, float(ms), None if joules is None else float(joules[i]), ops=ops)
                for i, ((nd, ops), ms) in enumerate(zip(profiles, latency))]
    todo, paths = [], []
    for i, (net, m) in enumerate(zip(networks, measured)):
        for tag in to_time_alone(m.nodes, net.layer_tags, net.floats, long_kernel_ms):
            todo.append((i, tag))
            paths.append(net.alone(tag))
    if paths:
        profiles, latency, _ = time_together(paths, protocol, workdir, rng, on_round)
        for (i, tag), (kernel_nodes, _), ms in zip(todo, profiles, latency):
            # Not the kernel's own: what the runtime runs before it (a layout reorder of its
            # input), and a layout reorder after it (of its output) - in a network a reorder
            # counts for no kernel and another node before it for the kernel before
            # (`attribute`).  What else runs after it counts for the kernel.
            first = next((k for k, (name, _) in enumerate(kernel_nodes) if TAG.search(name)), 0)
            besides = [t for _, t in kernel_nodes[:first]]
            besides += [t for name, t in kernel_nodes[first:] if name.startswith(LAYOUT) and not TAG.search(name)]
            measured[i].alone[tag] = (float(ms), float(sum(besides)), len(besides))
    return measured


def measure_chunks(chunks: Iterable[tuple[int, Sequence[Network]]], references: Sequence[Network],
                   protocol: Protocol, workdir: Path, on_round: Optional[Callable[[], None]] = None,
                   long_kernel_ms: float = 0.5) -> Iterator[tuple[list[NetworkTimes], list[NetworkTimes]]]:
    """Measure (seed, networks) chunks one after the other (chunks bound the memory of open
    sessions), the reference networks in every chunk beside them (interleaved: a busy
    spell slows every network of a chunk alike, and how much the references slowed tells
    by how much); yields each chunk's times and its references' times."""
    for k, (seed, networks) in enumerate(chunks):
        folder = Path(workdir) / f"chunk{k}"
        folder.mkdir(parents=True, exist_ok=True)
        times = measure_chunk([*networks, *references], protocol, folder, seed, on_round, long_kernel_ms)
        yield times[:len(networks)], times[len(networks):]


def machine(opset: Optional[int] = None) -> dict:
    """What the measurements ran on."""
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "system": platform.system(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "onnx_opset": opset}


# --- the bundle ------------------------------------------------------------------------

def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bundle_id(doc: dict) -> str:
    """The id of a bundle: a hash of its description (bundle.json less the id), which holds
    every file's SHA-256."""
    text = json.dumps({k: v for k, v in doc.items() if k != "id"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_bundle(folder: Path, check_files: bool = True) -> dict:
    """A bundle's description (bundle.json), checked: its format and id, and with
    `check_files` that every file it lists is there with its SHA-256."""
    folder = Path(folder)
    path = folder / BUNDLE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{folder} is not a complete profiling bundle: {BUNDLE_FILE} is missing") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path} cannot be read ({type(e).__name__}); write the bundle again with "
                         f"`nasctl hw bundle`") from None
    if not isinstance(doc, dict) or doc.get("format") != BUNDLE_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise InputError(f"{path} has bundle format {found!r}; this runner reads format {BUNDLE_FORMAT}")
    try:
        if doc["id"] != bundle_id(doc):
            raise InputError(f"{path} was edited (its id {doc['id']} does not match its contents); write the "
                             f"bundle again with `nasctl hw bundle`")
        files = [(n["file"], n["sha256"]) for n in [*doc["networks"], *doc["references"]]]
        files += [(n["data"], n["data_sha256"]) for n in [*doc["networks"], *doc["references"]] if n.get("data")]
        files += [(k["file"], k["sha256"]) for n in [*doc["networks"], *doc["references"]]
                  for k in n["kernels"].values()]
        chunks = [(int(c["seed"]), [int(i) for i in c["networks"]]) for c in doc["chunks"]]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{path} is malformed ({type(e).__name__}: {e}); write the bundle again with "
                         f"`nasctl hw bundle`") from None
    if any(not 0 <= i < len(doc["networks"]) for _, nets in chunks for i in nets):
        raise InputError(f"{path} is malformed: a chunk names a network it does not list")
    if check_files:
        for name, digest in files:
            file = folder / name
            if not file.is_file():
                raise InputError(f"{folder} is not a complete profiling bundle: {name} is missing")
            if sha256_of(file) != digest:
                raise InputError(f"{folder / name} has changed since the bundle was written (its SHA-256 differs "
                                 f"from {BUNDLE_FILE}'s)")
    return doc


def bundle_network(folder: Path, entry: dict) -> Network:
    """The `Network` of a bundle.json entry (its layers' names carry their kernel tags)."""
    kernels = {int(tag): Path(folder) / k["file"] for tag, k in entry["kernels"].items()}
    return Network(Path(folder) / entry["file"], [tag_of(layer.get("name", "")) for layer in entry["layers"]],
                   [int(layer.get("w_bits", 32)) == 32 for layer in entry["layers"]],
                   lambda tag: kernels[tag])


def network_name(entry: dict) -> str:
    return Path(entry["file"]).name


def run_bundle(folder: Path, protocol: Protocol, out: Path,
               on_progress: Optional[Callable[[int, int, int, int], None]] = None) -> int:
    """Measure a bundle's networks by `protocol` and write the results CSV to `out` (one
    row per record, see `RESULTS_COLUMNS`); returns the number of rows.
    `on_progress(rounds done, rounds in all, chunks measured, chunks)` follows the rounds."""
    folder, out = Path(folder), Path(out)
    doc = read_bundle(folder)
    networks = [bundle_network(folder, e) for e in doc["networks"]]
    references = [bundle_network(folder, e) for e in doc["references"]]
    chunks = [(int(c["seed"]), [int(i) for i in c["networks"]]) for c in doc["chunks"]]
    total = 3 * protocol.rounds * len(chunks)  # per chunk: profiled rounds, end-to-end rounds, long kernels alone
    state = {"done": 0, "finished": 0}

    def progress() -> None:
        if on_progress is not None:
            on_progress(state["done"], total, state["finished"], len(chunks))

    def tick() -> None:
        state["done"] = min(state["done"] + 1, total)
        progress()

    try:  # before measuring: a place it cannot write to is told at once
        out.parent.mkdir(parents=True, exist_ok=True)
        f = open(out, "w", newline="", encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write '{out}': {e.strerror}") from None
    start = time.perf_counter()
    rows: list[list] = []
    try:
        with f, tempfile.TemporaryDirectory(prefix="nasctl-runner-") as tmp:
            progress()
            measured = measure_chunks(((seed, [networks[i] for i in nets]) for seed, nets in chunks), references,
                                      protocol, Path(tmp), tick, float(doc.get("long_kernel_ms", 0.5)))
            for k, ((_, nets), (times, ref_times)) in enumerate(zip(chunks, measured)):
                entries = [*(doc["networks"][i] for i in nets), *doc["references"]]
                for entry, t in zip(entries, [*times, *ref_times]):
                    rows += _network_rows(k, network_name(entry), t)
                state.update(finished=k + 1, done=max(state["done"], 3 * protocol.rounds * (k + 1)))
                progress()
            meta = {"results_format": RESULTS_FORMAT, "bundle_format": doc["format"], "bundle_id": doc["id"],
                    "runner_sha256": sha256_of(Path(__file__)), "threads": protocol.threads,
                    "rounds": protocol.rounds, "repeats": protocol.repeats, "warmup": protocol.warmup,
                    "sessions": protocol.sessions, "clock": protocol.clock,
                    "measuring_seconds": round(time.perf_counter() - start, 1),
                    **{f"machine.{k}": v for k, v in machine(doc.get("opset")).items()}}
            rows[:0] = [["meta", "", "", k, v, "", ""] for k, v in meta.items()]
            writer = csv.writer(f)
            writer.writerow(RESULTS_COLUMNS)
            writer.writerows(rows)
            writer.writerow(["end", "", "", "", len(rows), "", ""])  # a file cut short lacks it
    except BaseException:  # interrupted or failed: no half-written results
        out.unlink(missing_ok=True)
        raise
    return len(rows) + 2


def _network_rows(chunk: int, name: str, t: NetworkTimes) -> list[list]:
    rows = [["latency", chunk, name, "", repr(t.latency_ms), len(t.nodes), ""]]
    if t.energy_mj is not None:
        rows.append(["energy", chunk, name, "", repr(t.energy_mj), "", ""])
    rows += [["node", chunk, name, node, repr(ms), "", t.ops.get(node, "")] for node, ms in t.nodes]
    for tag, (ms, before_ms, before_nodes) in sorted(t.alone.items()):
        rows.append(["alone", chunk, name, tag, repr(ms), "", ""])
        rows.append(["alone_before", chunk, name, tag, repr(before_ms), before_nodes, ""])
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description="Measure a nasctl profiling bundle's networks with onnxruntime and "
                                             "write the results CSV for `nasctl hw fit --bundle-results`.")
    ap.add_argument("--bundle", type=Path, default=here, help="the bundle folder (default: this script's)")
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (default 15)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per item and round (default 3)")
    ap.add_argument("--sessions", type=int, default=3,
                    help="sessions each network is timed end to end in, the median one's time (default 3)")
    ap.add_argument("--out", type=Path, help=f"the results CSV (default: {RESULTS_FILE} in the bundle folder)")
    args = ap.parse_args(argv)
    for flag, value, least in (("--threads", args.threads, 1), ("--rounds", args.rounds, 2),
                               ("--repeats", args.repeats, 1), ("--sessions", args.sessions, 1)):
        if value < least:
            print(f"runner: error: {flag} {value}: must be at least {least}", file=sys.stderr)
            return 2
    out = args.out or args.bundle / RESULTS_FILE
    tty = sys.stderr.isatty()
    start = time.perf_counter()
    last = {"finished": 0}

    def progress(done: int, total: int, finished: int, chunks: int) -> None:
        # On a terminal one line, redrawn every round; in a log a line per chunk measured.
        seconds = time.perf_counter() - start
        line = f"runner: {done}/{total} rounds, {finished}/{chunks} chunks measured, {seconds:.0f} s"
        if tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif done == 0 or finished != last["finished"]:
            last["finished"] = finished
            print(line, file=sys.stderr, flush=True)

    try:
        run_bundle(args.bundle, Protocol(threads=args.threads, rounds=args.rounds, repeats=args.repeats,
                                         sessions=args.sessions), out, progress)
    except InputError as e:
        print(f"{chr(10) if tty else ''}runner: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{chr(10) if tty else ''}runner: interrupted; no results written", file=sys.stderr)
        return 130
    print(f"{chr(10) if tty else ''}runner: wrote {out} in {time.perf_counter() - start:.0f} s; bring it back and run "
          f"`nasctl hw fit --device NAME --bundle-results {out.name}` beside the bundle's {BUNDLE_FILE}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
