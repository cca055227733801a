"""Profiling bundles: `hw bundle` writes the context networks and the runner; the runner
measures them with only numpy and onnxruntime importable; `hw fit --bundle-results`
builds the device, and refuses results that do not belong to the bundle beside them."""

import csv
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.hardware.measure.bundle import read_results, write_bundle
from nasctl.hardware.measure.runner import BUNDLE_FILE, RESULTS_COLUMNS

KERNELS, SEED = 30, 2

# Runs a script with nasctl, torch, onnx and the rest of nasctl's environment unimportable:
# what a target machine holding only numpy and onnxruntime offers.
ISOLATED = """
import runpy, sys
BLOCKED = {"nasctl", "torch", "onnx", "scipy", "sklearn", "typer", "rich", "yaml", "pandas", "optuna", "pymoo"}
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], "imported at start-up"
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed on the target")
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_isolated(script, *args, cwd):
    return subprocess.run([sys.executable, "-I", "-c", ISOLATED, str(script), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def tiny_bundle(folder):
    """The tests' bundle.  Kernels that profile longer than a bundle's threshold are timed
    again alone; this tiny bundle's longest kernels profile near the default 0.5 ms, above it
    on an AMD EPYC and below it on a faster Xeon, so the threshold is set where every
    machine times some alone (the bundle records it, the runner reads it)."""
    import nasctl.hardware.measure.bundle as bundle

    default, bundle.LONG_KERNEL_MS = bundle.LONG_KERNEL_MS, 0.01
    try:
        return write_bundle(folder, kernels=KERNELS, seed=SEED)
    finally:
        bundle.LONG_KERNEL_MS = default


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A tiny bundle, measured by its runner in the isolated interpreter: (folder, runner's stderr)."""
    folder = tmp_path_factory.mktemp("target") / "bundle"
    tiny_bundle(folder)
    assert json.loads((folder / BUNDLE_FILE).read_text())["long_kernel_ms"] == 0.01
    done = run_isolated(folder / "runner.py", "--rounds", 2, "--repeats", 1, cwd=folder.parent)
    assert done.returncode == 0, done.stderr
    return folder, done.stderr


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(result, text, code=2):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and text in lines[0], result.stderr


def rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def write_rows(path, table, recount=True):
    """Write CSV rows, with the end row counting them again (an edit the runner's count
    alone would not catch)."""
    if recount:
        table = [*table[:-1], ["end", "", "", "", str(len(table) - 2), *[""] * (len(table[0]) - 5)]]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(table)
    return path


def test_the_runner_measures_without_nasctl_and_the_results_make_a_device(measured, tmp_path):
    folder, stderr = measured
    results = folder / "results.csv"
    table = rows(results)
    assert tuple(table[0]) == RESULTS_COLUMNS and table[-1][0] == "end"
    meta = {r[3]: r[4] for r in table if r[0] == "meta"}
    doc = json.loads((folder / BUNDLE_FILE).read_text())
    assert meta["bundle_id"] == doc["id"] and meta["threads"] == "1" and meta["rounds"] == "2"
    assert meta["machine.onnxruntime"] and meta["clock"] == "thread_cpu"
    assert meta["sessions"] == "3"  # each network end to end: the median of three sessions
    names = {r[2] for r in table if r[0] == "latency"}
    assert names == {f"net{i:04d}.onnx" for i in range(len(doc["networks"]))} | {"ref0.onnx", "ref1.onnx", "ref2.onnx"}
    assert any(r[0] == "node" for r in table) and any(r[0] == "alone" for r in table)
    # the progress line: rounds counted, each chunk reported, the file named
    assert "runner: 0/6 rounds" in stderr and "6/6 rounds, 1/1 chunks measured" in stderr
    assert f"wrote {results}" in stderr

    ws = tmp_path / "ws"
    ws.mkdir()
    result = invoke("--workspace", ws, "hw", "fit", "--device", "target", "--bundle-results", results, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kernels"] > 0
    shown = json.loads(invoke("--workspace", ws, "hw", "show", "target", "--json").stdout)
    assert shown["kind"] == "lut" and "bundle" in shown["description"]
    assert shown["measurement"]["bundle"]["id"] == doc["id"] and shown["measurement"]["rounds"] == 2
    assert shown["measurement"]["sessions_per_model"] == 3
    from nasctl.hardware.loader import load_device
    from nasctl.hardware.measure.bundle import fit_bundle_results

    device = load_device(str(ws / "hardware" / "target" / "spec.yaml"))
    networks, *_ = read_results(results)
    assert all(device.estimate(m.layers).latency_ms > 0 for m in networks)
    # validated beside another device against the same measurements
    from nasctl.hardware.measure.profile import validate_models

    models = [folder / "networks" / "ref1.onnx", folder / "networks" / "net0000.onnx"]
    doc = validate_models(device, models, rounds=2, compare=[device])
    assert [r["measured_ms"] for r in doc["compared"][0]["models"]] == [r["measured_ms"] for r in doc["models"]]
    assert doc["compared"][0]["summary"] == doc["summary"] and "machine_vs_profile" in doc["summary"]
    # the machine's speed now told by the bundle's own context networks, built again here from its seed
    speed = shown["measurement"]["speed_references"]["networks"]
    assert speed and doc["summary"]["machine_vs_profile_from"] == f"{len(speed)} of the profile's context networks"
    # fitted again without measuring, to the same device (the networks travel with it)
    from nasctl.hardware.measure.profile import refit_profile

    assert refit_profile("target", ws / "hardware" / "target").rows == fit_bundle_results("target", results).rows


def test_the_bundle_holds_the_networks_hw_profile_measures_in_its_chunks(measured):
    from nasctl.hardware.onnx_import import import_onnx
    from nasctl.hardware.measure.profile import chunk_seeds, context_networks

    folder, _ = measured
    networks, measurement, chunk_of, reference_ms = read_results(folder / "results.csv")
    ours = context_networks(KERNELS, SEED)
    assert [m.description for m in networks] == [d for _, d in ours]
    path = folder.parent / "inline.onnx"
    path.write_bytes(ours[-1][0].SerializeToString())
    from nasctl.hardware.lut import row_from_layer

    as_rows = lambda layers: [(row_from_layer(l, 0.0), l.name) for l in layers]  # noqa: E731 - as the table holds them
    assert as_rows(networks[-1].layers) == as_rows(import_onnx(path).layers)
    assert chunk_of == [k for k, (_, members) in enumerate(chunk_seeds(len(ours), 80, SEED)) for _ in members]
    assert len(reference_ms) == 1 and len(reference_ms[0]) == 3 and measurement["seed"] == SEED
    # the same seed writes the same bundle
    again = tiny_bundle(folder.parent / "again")
    assert again["id"] == json.loads((folder / BUNDLE_FILE).read_text())["id"]


def edited(folder, tmp_path, edit):
    """A copy of the bundle's description with its results CSV edited by `edit(rows)`."""
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(folder / BUNDLE_FILE, copy / BUNDLE_FILE)
    table = edit(rows(folder / "results.csv"))
    return write_rows(copy / "results.csv", table, recount=table is not None and table[-1][0] == "end")


def without(predicate):
    return lambda table: [r for r in table if not predicate(r)]


def meta_set(key, value):
    return lambda table: [r[:4] + [value] + r[5:] if r[0] == "meta" and r[3] == key else r for r in table]


@pytest.mark.parametrize("edit, message", [
    (without(lambda r: r[2] == "net0001.onnx"), "net0001.onnx (chunk 0) is missing"),
    (without(lambda r: r[0] == "node" and r[2] == "net0000.onnx" and r[3].startswith("k2:")), "node times"),
    (without(lambda r: r[0] == "latency" and r[2] == "ref1.onnx"), "unexpected 'node' row for ref1.onnx"),
    (without(lambda r: r[0] == "alone"), "timed alone, is missing"),
    (meta_set("results_format", "3"), "results format '3'"),
    (meta_set("bundle_format", "0"), "(format 0)"),
    (meta_set("bundle_id", "0123456789abcdef"), "results of bundle '0123456789abcdef'"),
    (meta_set("runner_sha256", "0" * 64), "runner.py other than"),
    (lambda table: [r if r[0] != "node" else r[:4] + ["fast"] + r[5:] for r in table], "'fast' is not a time"),
])
def test_results_that_do_not_match_the_bundle_are_one_line(measured, tmp_path, edit, message):
    folder, _ = measured
    ws = tmp_path / "ws"
    ws.mkdir()
    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results",
                    edited(folder, tmp_path, edit)), message)
    assert not (ws / "hardware" / "t").exists()


def test_results_need_alone_only_the_kernels_the_runner_times_alone():
    # An int8 network's GELU as torch exports it: one kernel (k5) of four layers, each read
    # from its own node, its erf profiled at 0.6 ms.  Attributed by node numbers (as a
    # profile's rows are) the erf layer is long; the runner, which knows tags only, splits
    # the kernel's 0.9 ms evenly and times none of it alone - so the results cannot hold it,
    # and reading them must not ask for it (a 15,000-kernel bundle's results were refused so).
    from nasctl.hardware.measure import runner

    nodes = [("k4:conv_0", 0.2), ("k5:div_1", 0.1), ("k5:erf_2", 0.6), ("k5:add_3", 0.1), ("k5:mul_4", 0.1)]
    tags, floats = [4, 5, 5, 5, 5], [True] * 5
    numbered, _ = runner.attribute(nodes, tags, [0, 1, 2, 3, 4])
    assert runner.long_kernels(numbered, tags, floats, 0.5) == {5: [2]}
    assert runner.to_time_alone(nodes, tags, floats, 0.5) == {}
    assert runner.to_time_alone(nodes, tags, floats, 0.2) == {5: [1, 2, 3, 4]}


def test_bad_results_files_are_one_line(measured, tmp_path):
    folder, _ = measured
    ws = tmp_path / "ws"
    ws.mkdir()

    def fit(path):
        return invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results", path)

    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(np.random.default_rng(0).bytes(4000))
    one_line(fit(garbage), "not the results CSV of a bundle's runner")
    lut = tmp_path / "lut.csv"
    lut.write_text("op,in_ch,out_ch\nconv,3,8\n")
    one_line(fit(lut), "not the results CSV of a bundle's runner")
    cut = edited(folder, tmp_path, lambda table: table[:-20])
    one_line(fit(cut), "cut short")
    one_line(fit(tmp_path / "nothing.csv"), "no such file")
    one_line(fit(folder), "is a folder; give the results CSV in it")
    opless = tmp_path / "opless"  # the op column cut off results of this format
    opless.mkdir()
    shutil.copy(folder / BUNDLE_FILE, opless / BUNDLE_FILE)
    write_rows(opless / "results.csv", [r[:6] for r in rows(folder / "results.csv")], recount=False)
    one_line(fit(opless / "results.csv"), "its header should be")
    lonely = tmp_path / "lonely" / "deeper"
    lonely.mkdir(parents=True)
    shutil.copy(folder / "results.csv", lonely / "results.csv")
    one_line(fit(lonely / "results.csv"), "no bundle.json beside it")
    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results", folder / "results.csv",
                    "--lut", lut), "--bundle-results FILE goes alone")


def test_a_network_timed_at_zero_is_one_line_and_a_file_where_the_device_goes_is_refused(measured, tmp_path):
    folder, _ = measured
    ws = tmp_path / "ws"
    ws.mkdir()
    first = [True]

    def zero_latency(table):
        out = []
        for r in table:
            if r[0] == "latency" and first[0]:
                r, first[0] = [*r[:4], "0", *r[5:]], False
            out.append(r)
        return out

    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results",
                    edited(folder, tmp_path, zero_latency)), "'0' is not a time (a number > 0)")
    (ws / "hardware").mkdir()
    (ws / "hardware" / "t").write_text("a file, not a device folder")
    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results", folder / "results.csv"),
             "is a file, not a folder")


def test_results_of_an_older_runner_are_one_line(measured, tmp_path):
    """Results format 1 (no op types: the fusion of int8 kernels on the target untold)."""
    folder, _ = measured
    ws = tmp_path / "ws"
    ws.mkdir()

    def older(table):
        return [r[:6] if not (r[0] == "meta" and r[3] == "results_format") else [*r[:4], "1", ""] for r in table]

    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results",
                    edited(folder, tmp_path, older)), "results format '1'; this nasctl reads format 2")
    assert not (ws / "hardware" / "t").exists()


def test_results_of_another_bundle_or_an_edited_bundle_are_one_line(measured, tmp_path):
    folder, _ = measured
    ws = tmp_path / "ws"
    ws.mkdir()
    other = tmp_path / "other"
    write_bundle(other, kernels=20, seed=SEED + 1)
    shutil.copy(folder / "results.csv", other / "results.csv")
    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results", other / "results.csv"),
             "but " + str(other / BUNDLE_FILE) + " is bundle")
    doc = json.loads((other / BUNDLE_FILE).read_text())
    doc["networks"][0]["description"] = "edited"
    (other / BUNDLE_FILE).write_text(json.dumps(doc))
    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results", other / "results.csv"),
             "was edited")
    (other / BUNDLE_FILE).write_text("{not json")
    one_line(invoke("--workspace", ws, "hw", "fit", "--device", "t", "--bundle-results", other / "results.csv"),
             "cannot be read")


def runner_error(result, text):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runner: error:") and text in lines[0], result.stderr


def test_the_runner_refuses_an_incomplete_or_changed_bundle_in_one_line(measured, tmp_path):
    folder, _ = measured
    copy = tmp_path / "bundle"
    shutil.copytree(folder, copy)
    (copy / "results.csv").unlink()
    runner_error(run_isolated(copy / "runner.py", "--out", copy / "README.txt" / "results.csv", cwd=tmp_path),
                 "cannot write")
    doc = json.loads((copy / BUNDLE_FILE).read_text())
    data = copy / doc["networks"][0]["data"]
    data.write_bytes(data.read_bytes()[:-8])
    runner_error(run_isolated(copy / "runner.py", cwd=tmp_path), "has changed since the bundle was written")
    data.unlink()
    runner_error(run_isolated(copy / "runner.py", cwd=tmp_path), f"{doc['networks'][0]['data']} is missing")
    runner_error(run_isolated(copy / "runner.py", "--rounds", 1, cwd=tmp_path), "--rounds 1: must be at least 2")
    runner_error(run_isolated(copy / "runner.py", "--sessions", 0, cwd=tmp_path), "--sessions 0: must be at least 1")
    (copy / BUNDLE_FILE).unlink()
    runner_error(run_isolated(copy / "runner.py", cwd=tmp_path), "bundle.json is missing")
    assert not (copy / "results.csv").exists()


def test_bundle_needs_a_new_folder(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("x")
    one_line(invoke("hw", "bundle", "--out", tmp_path / "full", "--kernels", 20), "exists and is not an empty folder")
    (tmp_path / "stopped" / "networks").mkdir(parents=True)  # a bundle whose writing Ctrl-C stopped
    (tmp_path / "stopped" / "networks" / "net0000.onnx").write_bytes(b"")
    one_line(invoke("hw", "bundle", "--out", tmp_path / "stopped", "--kernels", 20),
             "holds an unfinished bundle (no bundle.json")


# --- int8 kernels: fused or dequantized as the target ran them ----------------------------

@pytest.fixture(scope="module")
def int8_measured(tmp_path_factory):
    """A bundle of one int8 network (a 5x5 conv, global average pooling, a linear layer,
    all fused into integer kernels by this onnxruntime), measured in this process."""
    from nasctl.hardware.measure.runner import Protocol, run_bundle

    folder = tmp_path_factory.mktemp("int8") / "bundle"
    write_bundle(folder, kernels=3, seed=25)
    run_bundle(folder, Protocol(rounds=2, repeats=1), folder / "results.csv")
    return folder


def test_int8_kernels_are_labelled_as_the_target_ran_them(int8_measured, tmp_path):
    from nasctl.hardware.measure.bundle import fit_bundle_results

    folder = int8_measured
    doc = json.loads((folder / BUNDLE_FILE).read_text())
    layers = doc["networks"][0]["layers"]
    assert [(r["op"], r["w_bits"], r["dequantized"]) for r in layers] == [("conv", 8, 0), ("pool", 8, 0),
                                                                          ("linear", 8, 0)]
    table = rows(folder / "results.csv")
    ops = {r[3]: r[6] for r in table if r[0] == "node" and r[2] == "net0000.onnx"}
    assert "QLinearConv" in ops.values() and ops["k3:gemm_4"] == "QGemm"
    # unchanged results: the bundle's labels, each told by the target's profile
    fitted = fit_bundle_results("same", folder / "results.csv")
    assert [r["dequantized"] for r in fitted.rows] == [0, 0, 0]
    fusion = fitted.spec["measurement"]["int8_fusion"]
    assert fusion["int8_kernels"] == 3 and fusion["told_by_target"] == 3 and fusion["changed_by_target"] == 0
    assert fusion["onnxruntime"] == fusion["bundle_onnxruntime"] == doc["onnxruntime"]

    # The target ran the conv dequantized: a float Conv between the quantization nodes.
    def dequantized_conv(table):
        out = []
        for r in table:
            if r[0] == "node" and r[6] == "QLinearConv":
                r = [*r[:3], "k1:conv_0", *r[4:6], "Conv"]
            out.append(r)
        return out

    ws = tmp_path / "ws"
    ws.mkdir()
    result = invoke("--workspace", ws, "hw", "fit", "--device", "target", "--bundle-results",
                    edited(folder, tmp_path, dequantized_conv))
    assert result.exit_code == 0, result.output
    assert "3 of 3 told by its profile, 1 labelled otherwise than in the bundle" in result.stdout
    header, *lut = rows(ws / "hardware" / "target" / "lut.csv")
    flag = {r[header.index("op")]: r[header.index("dequantized")] for r in lut}
    assert flag == {"conv": "1", "pool": "0", "linear": "0"}
    shown = json.loads(invoke("--workspace", ws, "hw", "show", "target", "--json").stdout)
    fusion = shown["measurement"]["int8_fusion"]
    assert fusion["changed_by_target"] == 1 and fusion["now_dequantized"] == 1 and fusion["now_fused"] == 0

    # where the target's profile cannot tell (no op type recorded), the bundle's label stays
    blank = lambda table: [[*r[:6], ""] if r[0] == "node" and r[3].startswith("k1:") else r for r in table]
    (tmp_path / "blank").mkdir()
    kept = fit_bundle_results("kept", edited(folder, tmp_path / "blank", blank))
    assert [r["dequantized"] for r in kept.rows] == [0, 0, 0]
    assert kept.spec["measurement"]["int8_fusion"]["told_by_target"] == 2


def test_fusion_is_read_from_the_op_types_of_each_kernel_tag():
    from nasctl.hardware.layers import LayerSpec
    from nasctl.hardware.measure.attribution import fusion_in_profile

    def q(name, op="conv", w_bits=8):
        return LayerSpec(op, 8, 8, (4, 4), (4, 4), w_bits=w_bits, a_bits=w_bits, name=name)

    layers = [q("k1:conv_0"), q("k2:matmul_1", "linear"), q("k3:add_2", "add"), q("k4:conv_3", w_bits=32),
              q("k5:resize_4", "resize"), q("k6:add_5", "add"), q("k6:mul_6", "mul")]
    ops = {"k1:input_QuantizeLinear": "QuantizeLinear", "k1:conv_0": "Conv", "k1:act_1_QuantizeLinear":
           "QuantizeLinear", "k2:matmul_1_quant": "QLinearMatMul", "k2:bias_add": "Add", "k3:add_2_token_7":
           "QLinearAdd", "k4:conv_3": "Conv", "k5:resize_4": "Resize", "k6:add_5": "QLinearAdd", "k6:mul_6": "Mul"}
    # k1 float between Q/DQ: dequantized; k2 integer beside its float bias add: fused; k3 fused;
    # k4 a float kernel, k5 an op named alike either way, k6 two kernels of a tag with both: untold
    assert fusion_in_profile(layers, ops) == [True, False, False, None, None, None, None]
