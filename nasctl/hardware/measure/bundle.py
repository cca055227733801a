"""Profiling bundles: the context networks of `nasctl hw profile`, measured on another
machine (`nasctl hw bundle`), and the `lut` device fitted to what it measured
(`nasctl hw fit --bundle-results FILE`).

A bundle is a folder:

  bundle.json    format, id (a hash of this description, which holds every file's
                 SHA-256), nasctl and onnxruntime versions, opset, seed, the chunks the
                 networks are measured in (each with the seed of its inputs), and per
                 network its files, its description and its layers as the ONNX importer
                 reads them (kernel-table rows with the layer names, which carry the
                 kernel tags; `dequantized` as this machine's onnxruntime fuses them)
  networks/      the context networks and reference networks (`NAME.onnx`, weights in
                 `NAME.data`), and each float kernel cut out of its network
                 (`NAME-kTAG.onnx`, reading its weights from the network's `NAME.data`)
                 for the runner to time alone if it profiles long
  runner.py      `nasctl.hardware.measure.runner`, copied verbatim: Python, numpy and
                 onnxruntime only
  README.txt     the two commands

The networks are those `hw profile --kernels N --seed S` measures, in the same chunks
with the same inputs; the runner measures them by the same functions, and the device is
fitted by `profile.fit_profile` from the same kind of measurements: the device is what
`hw profile` would have built on the target.  Which int8 kernels run fused or dequantized
differs across onnxruntime builds and versions, so it is read from what the target ran
(the op types its profile records, `attribution.fusion_in_profile`); the bundle's labels
stay where the target's profile cannot tell.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from ...errors import UsageError
from . import runner
from .runner import BUNDLE_FILE, BUNDLE_FORMAT, RESULTS_COLUMNS, RESULTS_FORMAT, NetworkTimes, Protocol

NETWORKS_DIR = "networks"
RUNNER_FILE = "runner.py"
README_FILE = "README.txt"
LONG_KERNEL_MS = 0.5  # kernels that profile longer are timed again alone (attribution.measure_networks)


def _relink(kernel, external: dict) -> None:
    """Point the kernel model's weights at its network's external data file."""
    from onnx import TensorProto

    for t in kernel.graph.initializer:
        if t.name in external:
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            t.external_data.extend(external[t.name].external_data)


def _write_network(model, description: str, stem: str, folder: Path) -> dict:
    """Write one network (weights apart, in STEM.data) and its float kernels cut out of it;
    its bundle.json entry."""
    import onnx

    from ..lut import row_from_layer
    from ..onnx_import import import_onnx
    from .attribution import _kernel_alone, floats, layer_tags, layout_rows

    path = folder / f"{stem}.onnx"
    onnx.save_model(copy.deepcopy(model), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{stem}.data", size_threshold=1024)  # shapes and scales stay inline
    result = import_onnx(path)
    layers = result.layers
    saved = onnx.load(str(path), load_external_data=False)
    external = {t.name: t for t in saved.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    kernels = {}
    for tag in sorted({t for t, f in zip(layer_tags(layers), floats(layers)) if t is not None and f}):
        kernel = _kernel_alone(model, f"k{tag}:")
        _relink(kernel, external)
        file = folder / f"{stem}-k{tag}.onnx"
        file.write_bytes(kernel.SerializeToString())
        kernels[str(tag)] = {"file": f"{NETWORKS_DIR}/{file.name}", "sha256": runner.sha256_of(file)}
    data = folder / f"{stem}.data"
    return {"file": f"{NETWORKS_DIR}/{path.name}", "sha256": runner.sha256_of(path),
            "data": f"{NETWORKS_DIR}/{data.name}" if data.is_file() else None,
            "data_sha256": runner.sha256_of(data) if data.is_file() else None,
            "description": description, "layers": [{**row_from_layer(l, 0.0), "name": l.name} for l in layers],
            "layouts": layout_rows(result.layouts), "kernels": kernels}


def write_bundle(folder: Path, kernels: int = 5000, seed: int = 0, chunk: int = 80, references: int = 3,
                 on_progress: Optional[Callable[[int, int, str], None]] = None) -> dict:
    """Write a profiling bundle of the context networks `hw profile --kernels --seed` measures
    into `folder` (new or empty); a summary of what was written."""
    import onnxruntime as ort

    from ... import __version__
    from .context import OPSET
    from .profile import chunk_seeds, context_networks, reference_networks, seeding_for

    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        unfinished = folder.is_dir() and (folder / NETWORKS_DIR).is_dir() and not (folder / BUNDLE_FILE).exists()
        raise UsageError(f"--out {folder}: " + (f"holds an unfinished bundle (no {BUNDLE_FILE}: its writing was "
                                                 "stopped); remove it, or give a new folder" if unfinished else
                                                 "exists and is not an empty folder; give a new folder for the bundle"))
    if on_progress is not None:
        on_progress(0, 1, "building the context networks")
    networks = context_networks(kernels, seed)
    refs = reference_networks(references)
    netdir = folder / NETWORKS_DIR
    try:
        netdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {folder}: cannot create it ({e.strerror})") from None
    entries = []
    todo = [*[(m, d, f"net{i:04d}") for i, (m, d) in enumerate(networks)],
            *[(m, d, f"ref{k}") for k, (m, d) in enumerate(refs)]]
    for done, (model, description, stem) in enumerate(todo):
        entries.append(_write_network(model, description, stem, netdir))
        if on_progress is not None:
            on_progress(done + 1, len(todo), f"{len(todo)} networks")
    shutil.copyfile(runner.__file__, folder / RUNNER_FILE)
    doc = {"format": BUNDLE_FORMAT, "nasctl": __version__, "onnxruntime": ort.__version__, "opset": OPSET,
           "kernels": kernels, "seed": seed, "seeding": seeding_for(kernels),
           "chunk": chunk, "long_kernel_ms": LONG_KERNEL_MS, "runner": RUNNER_FILE,
           "runner_sha256": runner.sha256_of(folder / RUNNER_FILE),
           "networks": entries[:len(networks)], "references": entries[len(networks):],
           "chunks": [{"seed": s, "networks": list(members)} for s, members in chunk_seeds(len(networks), chunk, seed)]}
    doc["id"] = runner.bundle_id(doc)
    (folder / BUNDLE_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    layers = sum(len(e["layers"]) for e in doc["networks"])
    (folder / README_FILE).write_text(README.format(id=doc["id"], version=__version__, layers=layers,
                                                    networks=len(networks), seed=seed, results=runner.RESULTS_FILE,
                                                    bundle=BUNDLE_FILE, runner=RUNNER_FILE), encoding="utf-8")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {"out": str(folder), "id": doc["id"], "networks": len(networks), "references": len(refs),
            "kernels": layers, "kernel_files": sum(len(e["kernels"]) for e in entries), "chunks": len(doc["chunks"]),
            "megabytes": round(size / 1e6, 1), "seed": seed}


README = """nasctl profiling bundle {id} (nasctl {version}):
{layers} kernels in {networks} context networks, seed {seed}.

1. Copy this folder to the machine to profile. It needs Python 3.8 or later with numpy and
   onnxruntime (pip install numpy onnxruntime); not nasctl, not torch.
2. There, with the machine otherwise idle, run

       python {runner} [--threads T] [--rounds R]

   It measures every network as `nasctl hw profile` does (onnxruntime CPU, T intra-op
   threads, default 1; interleaved rounds, minimum; in-context kernel times from
   onnxruntime's profiler) and writes {results} into this folder. A progress line counts
   the rounds.
3. Bring {results} back into this folder (beside {bundle}) and run

       nasctl hw fit --device NAME --bundle-results {results}

   in a nasctl workspace: it writes the `lut` device NAME, as `nasctl hw profile` would
   have on that machine.
"""


# --- the results ------------------------------------------------------------------------

def _bundle_beside(results: Path) -> Path:
    for folder in (results.parent, results.parent.parent):
        if (folder / BUNDLE_FILE).is_file():
            return folder
    raise UsageError(f"--bundle-results {results}: no {BUNDLE_FILE} beside it or in its parent folder; put the "
                     f"results CSV into the folder `nasctl hw bundle` wrote")


RESULTS_COLUMNS_1 = RESULTS_COLUMNS[:6]  # results format 1: no op types


def _other_format(what: str, found) -> UsageError:
    return UsageError(f"{what}: results format {found!r}; this nasctl reads format {RESULTS_FORMAT} (measure "
                      f"with the runner of a bundle this nasctl wrote)")


def _rows(results: Path) -> list[list[str]]:
    """The results CSV's rows (without the header and the end row), checked whole."""
    what = f"--bundle-results {results}"
    try:
        with open(results, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{what}: is a folder; give the results CSV in it (FOLDER/results.csv)") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what}: not the results CSV of a bundle's runner (not UTF-8 text)") from None
    except (OSError, csv.Error) as e:
        raise UsageError(f"{what}: not the results CSV of a bundle's runner ({type(e).__name__})") from None
    found = next((r[4] for r in rows if r[:1] == ["meta"] and len(r) > 4 and r[3] == "results_format"), None)
    if rows and tuple(rows[0]) == RESULTS_COLUMNS_1 and found != str(RESULTS_FORMAT):  # an older runner's
        raise _other_format(what, found)
    if not rows or tuple(rows[0]) != RESULTS_COLUMNS:
        raise UsageError(f"{what}: not the results CSV of a bundle's runner (its header should be "
                         f"{','.join(RESULTS_COLUMNS)})")
    body = rows[1:]
    if not body or body[-1][:1] != ["end"] or len(body[-1]) != len(RESULTS_COLUMNS) \
            or body[-1][4] != str(len(body) - 1):
        raise UsageError(f"{what}: the file is cut short or was edited (it does not end with the row that counts "
                         f"its {max(len(body) - 1, 0)} rows); run the runner again")
    for n, row in enumerate(body, start=2):
        if len(row) != len(RESULTS_COLUMNS):
            raise UsageError(f"{what}: line {n} has {len(row)} fields, not {len(RESULTS_COLUMNS)}")
    return body[:-1]


def _number(text: str, what: str, line: int, positive: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise UsageError(f"{what}: line {line}: '{text}' is not a time (a number {'>' if positive else '>='} 0)")
    return value


def read_results(results: Path):
    """The measured context networks of a bundle's results CSV, with how they were measured,
    their chunks and the reference networks' times per chunk (`profile.fit_profile`'s
    arguments), checked against the bundle beside it."""
    from ..lut import layer_from_row
    from .attribution import floats, fusion_in_profile, layer_tags, layout_from_rows, measured_network

    results = Path(results)
    what = f"--bundle-results {results}"
    rows = _rows(results)
    meta = {r[3]: r[4] for r in rows if r[0] == "meta"}
    if meta.get("results_format") != str(RESULTS_FORMAT):
        raise _other_format(what, meta.get("results_format"))
    folder = _bundle_beside(results)
    try:
        doc = runner.read_bundle(folder, check_files=False)
    except runner.InputError as e:
        raise UsageError(str(e)) from None
    if not isinstance(doc.get("seed"), int):
        raise UsageError(f"{folder / BUNDLE_FILE} is malformed (no whole-number seed); write the bundle again with "
                         "`nasctl hw bundle`")
    if meta.get("bundle_id") != doc["id"] or meta.get("bundle_format") != str(BUNDLE_FORMAT):
        raise UsageError(f"{what}: results of bundle {meta.get('bundle_id')!r} (format {meta.get('bundle_format')}), "
                         f"but {folder / BUNDLE_FILE} is bundle {doc['id']!r} (format {BUNDLE_FORMAT})")
    if meta.get("runner_sha256") != doc["runner_sha256"]:
        raise UsageError(f"{what}: measured by a runner.py other than bundle {doc['id']}'s (its SHA-256 differs)")
    try:
        protocol = Protocol(threads=int(meta["threads"]), rounds=int(meta["rounds"]), repeats=int(meta["repeats"]),
                            warmup=int(meta["warmup"]), sessions=int(meta.get("sessions", 1)))
    except (KeyError, ValueError) as e:
        raise UsageError(f"{what}: its protocol rows are missing or malformed ({type(e).__name__}: {e})") from None

    times: dict[tuple[str, str], NetworkTimes] = {}
    counts: dict[tuple[str, str], int] = {}
    for line, (record, chunk, network, name, value, count, op) in enumerate(rows, start=2):
        if record == "meta":
            continue
        key = (chunk, network)
        if record == "latency":
            times[key] = NetworkTimes([], _number(value, what, line, positive=True))
            counts[key] = int(_number(count, what, line))
            continue
        t = times.get(key)
        if t is None or record not in ("energy", "node", "alone", "alone_before"):
            raise UsageError(f"{what}: line {line}: unexpected {record!r} row for {network} (chunk {chunk})")
        if record == "energy":
            t.energy_mj = _number(value, what, line)
        elif record == "node":
            t.nodes.append((name, _number(value, what, line)))
            if op:
                t.ops[name] = op
        else:
            tag = int(_number(name, what, line))
            ms, before_ms, before_n = t.alone.get(tag, (math.nan, 0.0, 0))
            t.alone[tag] = ((_number(value, what, line), before_ms, before_n) if record == "alone"
                            else (ms, _number(value, what, line), int(_number(count, what, line))))

    measured, chunk_of, reference_ms = [], [], []
    fusion = Counter()  # int8 kernels: by the target's profile or the bundle's labels, and changed
    expected = set()
    long_ms = float(doc.get("long_kernel_ms", LONG_KERNEL_MS))
    for k, c in enumerate(doc["chunks"]):
        members = [(doc["networks"][i], True) for i in c["networks"]] + [(e, False) for e in doc["references"]]
        refs = []
        for entry, is_network in members:
            name = runner.network_name(entry)
            key = (str(k), name)
            expected.add(key)
            t = times.get(key)
            if t is None:
                raise UsageError(f"{what}: {name} (chunk {k}) is missing; run the runner again to the end")
            if len(t.nodes) != counts[key]:
                raise UsageError(f"{what}: {name} (chunk {k}) has {len(t.nodes)} of its {counts[key]} node times")
            layers = [replace(layer_from_row(r), name=r.get("name", "")) for r in entry["layers"]]
            if is_network:  # int8 kernels labelled fused or dequantized as the target ran them
                layers = _as_run(layers, fusion_in_profile(layers, t.ops), fusion)
            m = measured_network(entry["description"], layers, t, long_ms,
                                 layout_from_rows(entry["layouts"]) if "layouts" in entry else None)
            # what the runner timed alone: by its own rule (the layers of a kernel read from
            # several nodes split evenly), not by the node-numbered shares `m` holds
            need = runner.to_time_alone(t.nodes, layer_tags(layers), floats(layers), long_ms)
            lacking = sorted(set(need) - {tag for tag, v in t.alone.items() if not math.isnan(v[0])})
            if lacking:
                raise UsageError(f"{what}: kernel k{lacking[0]} of {name} (chunk {k}), timed alone, is missing")
            if is_network:
                measured.append(m)
                chunk_of.append(k)
            else:
                refs.append(t.latency_ms)
        reference_ms.append(refs)
    extra = sorted(set(times) - expected)
    if extra:
        raise UsageError(f"{what}: {extra[0][1]} (chunk {extra[0][0]}) is not a network of bundle {doc['id']}")

    def value(text: str):
        try:
            return int(text)
        except ValueError:
            return text

    machine = {key[len("machine."):]: value(v) for key, v in meta.items() if key.startswith("machine.")}
    seeding = {"seeding": doc["seeding"]} if "seeding" in doc else {}  # bundles written before it: drawn in turn
    measurement = {**protocol.describe(), "seed": doc["seed"], **seeding, "references": len(doc["references"]),
                   "machine": machine, "measuring_seconds": float(meta.get("measuring_seconds", 0) or 0),
                   "bundle": {"id": doc["id"], "nasctl": doc["nasctl"], "results": results.name}}
    if fusion["kernels"]:
        measurement["int8_fusion"] = {
            "from": "the op types the target's onnxruntime profiled for each int8 kernel's nodes (an integer kernel "
                    "such as QLinearConv: fused; float ops between DequantizeLinear and QuantizeLinear: "
                    "dequantized); the bundle's labels where they cannot tell",
            "onnxruntime": machine.get("onnxruntime"), "bundle_onnxruntime": doc.get("onnxruntime"),
            "int8_kernels": fusion["kernels"], "told_by_target": fusion["told"],
            "changed_by_target": fusion["to_dequantized"] + fusion["to_fused"],
            "now_dequantized": fusion["to_dequantized"], "now_fused": fusion["to_fused"]}
    return measured, measurement, chunk_of, reference_ms


def _as_run(layers: list, ran_dequantized: list, counts: Counter) -> list:
    """The layers with `dequantized` as the target ran them where its profile tells
    (`ran_dequantized`, None where it cannot), counting int8 kernels told and changed."""
    from ..onnx_import import _quantized_kernel

    out = []
    for layer, ran in zip(layers, ran_dequantized):
        counts["kernels"] += _quantized_kernel(layer)
        if ran is not None:
            counts["told"] += 1
            if ran != layer.dequantized:
                counts["to_dequantized" if ran else "to_fused"] += 1
                layer = replace(layer, dequantized=ran)
        out.append(layer)
    return out


def fit_bundle_results(name: str, results: Path):
    """The `lut` device NAME of a bundle's results CSV (`profile.fit_profile`, as `hw profile`
    fits its own measurements)."""
    from .profile import fit_profile

    return fit_profile(name, *read_results(results))
