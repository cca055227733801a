"""`nasctl predict`: totals, per-layer figures, JSON, and one-line errors."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.hardware import loader
from nasctl.hardware.base import CostModel, LayerCost

from cli_helpers import onnx_model

runner = CliRunner()
CONV_MACS, FC_MACS = 16 * 16 * 8 * 3 * 9, 8 * 10
PARAMS = (8 * 3 * 9 + 8) + (8 * 10 + 10)


def tiny_net(path, dims=(1, 3, 16, 16), extra=(), conv_in=3, bias=True, opset=17):
    """conv 3->8 (3x3, ReLU) -> 2x2 max pool -> global average pool -> fc 8->10 -> softmax;
    `conv_in`: the in-channels of the conv's weight; `bias`: whether the conv has one."""
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
         for n, s in [("w", (8, conv_in, 3, 3)), ("b", (8,)), ("fw", (10, 8)), ("fb", (10,))]]
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], name="conv",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["m"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["m"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], name="fc", transB=1),
             helper.make_node("Softmax", ["l"], ["y"], name="softmax"), *extra]
    outputs = ["y", *(n.output[0] for n in extra)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", T.FLOAT, list(dims))],
                              [helper.make_empty_tensor_value_info(o) for o in outputs], w)
    onnx.save(onnx_model(graph, opset), path)
    return str(path)


class PerMac(CostModel):
    """1 ns per MAC plus 1 µs per layer (energy twice that, in mJ); cannot price softmax."""

    def __init__(self, models_energy=True):
        self.name = "per-mac"
        self.models_energy = models_energy

    def _layer_cost(self, layer):
        if layer.op == "softmax":
            return None
        energy = 2 * (layer.macs * 1e-6 + 1e-3) if self.models_energy else None
        return LayerCost(layer.macs * 1e-6 + 1e-3, energy, "one")


@pytest.fixture
def per_mac(monkeypatch):
    def use(models_energy=True):
        monkeypatch.setattr(loader, "load_device", lambda name: PerMac(models_energy))
    return use


def invoke(*args):
    return runner.invoke(app, ["predict", *args])


def test_json_totals_and_layers(tmp_path, per_mac):
    per_mac()
    result = invoke(tiny_net(tmp_path / "tiny.onnx"), "--device", "per-mac", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["latency_ms"] == pytest.approx((CONV_MACS + FC_MACS) * 1e-6 + 4e-3)  # 4 layers priced
    assert doc["energy_mj"] == pytest.approx(2 * doc["latency_ms"])
    assert (doc["macs"], doc["params"], doc["weight_bytes"]) == (CONV_MACS + FC_MACS, PARAMS, PARAMS * 4)
    assert (doc["device"], doc["nodes"], doc["inputs"]) == ("per-mac", 7, {"x": [1, 3, 16, 16]})
    assert [(r["name"], r["op"], r["fn"]) for r in doc["layers"]] == [
        ("conv", "conv", "relu"), ("maxpool", "pool", "max"), ("gap", "pool", "avg"), ("fc", "linear", ""),
        ("softmax", "softmax", "")]
    conv = doc["layers"][0]
    assert conv["shapes"] == {"in": [3, 16, 16], "out": [8, 16, 16], "kernel": [3, 3], "stride": 1, "groups": 1}
    assert (conv["bits"], conv["macs"], conv["params"], conv["mapping"]) == ({"w": 32, "a": 32}, CONV_MACS, 224, "one")
    assert conv["latency_ms"] == pytest.approx(CONV_MACS * 1e-6 + 1e-3)
    assert doc["layers"][-1]["latency_ms"] is None and doc["layers"][-1]["energy_mj"] is None
    assert doc["unsupported"] == [{"op": "softmax", "count": 1, "reason": "per-mac cannot price it"}]
    warning, = result.stderr.strip().splitlines()
    assert warning.startswith("warning: not priced, so the latency and energy totals exclude them")
    assert "softmax x1 (per-mac cannot price it)" in warning
    # 1 of the 7 nodes (the softmax) is not priced
    assert doc["covered_nodes_share"] == pytest.approx(6 / 7) and "cover 86% of the model's 7 nodes" in warning


def test_a_model_of_which_nothing_can_be_priced_is_refused_in_one_line(tmp_path, per_mac):
    per_mac()
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="softmax")], "only-softmax",
                              [helper.make_tensor_value_info("x", T.FLOAT, [1, 10])],
                              [helper.make_empty_tensor_value_info("y")])
    onnx.save(onnx_model(graph, 17), tmp_path / "softmax.onnx")
    result = invoke(str(tmp_path / "softmax.onnx"), "--device", "per-mac")
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert "softmax.onnx: no op of its 1 nodes can be priced on 'per-mac'" in line
    assert "softmax x1 (per-mac cannot price it)" in line


def test_text_totals_and_per_layer_table(tmp_path, per_mac):
    per_mac()
    result = invoke(tiny_net(tmp_path / "tiny.onnx"), "--device", "per-mac", "--per-layer")
    assert result.exit_code == 0, result.output
    for text in ("latency       0.05938 ms", "energy        0.1188 mJ", f"MACs          {CONV_MACS + FC_MACS:,}",
                 f"params        {PARAMS:,}", "weight bytes  1,256", "5 layers, 4 priced",
                 "latency and energy exclude what was not priced"):
        assert text in result.stdout
    for name in ("conv", "maxpool", "gap", "fc", "softmax", "3x16x16 → 8x16x16", "55,296", "56.3"):
        assert name in result.stdout


def test_help():
    result = invoke("--help")
    assert result.exit_code == 0 and "--input-shape" in result.stdout and "--per-layer" in result.stdout


def test_latency_only_device(tmp_path, per_mac):
    per_mac(models_energy=False)
    path = tiny_net(tmp_path / "tiny.onnx")
    doc = json.loads(invoke(path, "--device", "per-mac", "--json").stdout)
    assert doc["energy_mj"] is None and doc["latency_ms"] > 0
    assert "energy        n/a (latency only)" in invoke(path, "--device", "per-mac").stdout


def test_edge_quad_prices_or_reports_every_layer(tmp_path):
    result = invoke(tiny_net(tmp_path / "tiny.onnx"), "--device", "edge-quad", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["macs"] == CONV_MACS + FC_MACS and doc["latency_ms"] > 0 and doc["energy_mj"] > 0
    not_priced = sum(1 for r in doc["layers"] if r["latency_ms"] is None)
    assert sum(u["count"] for u in doc["unsupported"]) == not_priced
    assert ("warning: not priced" in result.stderr) == (not_priced > 0)


def test_unsupported_onnx_op_is_listed_and_the_rest_priced(tmp_path, per_mac):
    per_mac()
    det = helper.make_node("Det", ["x"], ["d"], name="det")
    result = invoke(tiny_net(tmp_path / "det.onnx", extra=[det]), "--device", "per-mac", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert {"op": "Det", "count": 1, "reason": "not imported"} in doc["unsupported"]
    assert doc["macs"] == CONV_MACS + FC_MACS
    assert "Det x1 (not imported)" in result.stderr


@pytest.mark.parametrize("shape_args", [["--input-shape", "1x3x16x16"], ["--input-shape", "x:1x3x16x16"],
                                        ["--input-shape", "x:1x3x16x16,"]])
def test_dynamic_input_with_a_shape(tmp_path, per_mac, shape_args):
    per_mac()
    path = tiny_net(tmp_path / "dyn.onnx", dims=("batch", 3, "h", "w"))
    doc = json.loads(invoke(path, "--device", "per-mac", "--json", *shape_args).stdout)
    assert doc["macs"] == CONV_MACS + FC_MACS and doc["inputs"] == {"x": [1, 3, 16, 16]}


@pytest.mark.parametrize("case, message", [
    ("missing", "{tmp}/missing.onnx: no such file"),
    ("text", "{tmp}/notes.onnx: not an ONNX model"),
    ("truncated", "{tmp}/cut.onnx: not"),
    ("device", "unknown device 'nope'"),
    ("dynamic", "dyn.onnx: input 'x' has dynamic dims [batch, 3, h, w]; give them with --input-shape x:Nx3xNxN"),
    ("shape", "--input-shape '1x3xbig': expected positive dims joined by x"),
    ("no-device", "Missing option '--device'"),
    ("static-dim", "--input-shape x:1x5x16x16: the input is declared [batch, 3, h, w] (dim 1 is 3, 5 given); "
                   "only its dynamic dims can be set: give x:1x3x16x16"),
    ("conv-weight", "tiny5.onnx: node 'conv' (Conv): input 'x' [1, 3, 16, 16] has 3 channels, but weight 'w' "
                    "[8, 5, 3, 3] with group 1 takes 5; the model is inconsistent"),
    ("opset", "{tmp}/new.onnx: opset 99 (default ai.onnx domain) is newer than the installed onnx"),
])
def test_errors_are_one_line(tmp_path, case, message):
    good = tiny_net(tmp_path / "tiny.onnx")
    data = open(good, "rb").read()
    (tmp_path / "notes.onnx").write_text("layers: [conv, relu]\n")
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) * 2 // 3])
    args = {"missing": [str(tmp_path / "missing.onnx"), "--device", "edge-quad"],
            "text": [str(tmp_path / "notes.onnx"), "--device", "edge-quad"],
            "truncated": [str(tmp_path / "cut.onnx"), "--device", "edge-quad"],
            "device": [good, "--device", "nope"],
            "dynamic": [tiny_net(tmp_path / "dyn.onnx", dims=("batch", 3, "h", "w")), "--device", "edge-quad"],
            "shape": [good, "--device", "edge-quad", "--input-shape", "1x3xbig"],
            "no-device": [good],
            "static-dim": [tiny_net(tmp_path / "dyn.onnx", dims=("batch", 3, "h", "w")), "--device", "edge-quad",
                           "--input-shape", "1x5x16x16"],
            "conv-weight": [tiny_net(tmp_path / "tiny5.onnx", conv_in=5), "--device", "edge-quad"],
            "opset": [tiny_net(tmp_path / "new.onnx", opset=99), "--device", "edge-quad"]}[case]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    line, = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message.format(tmp=tmp_path) in line


def test_params_count_a_bias_only_where_the_model_has_one(tmp_path, per_mac):
    per_mac()
    doc = json.loads(invoke(tiny_net(tmp_path / "nobias.onnx", bias=False), "--device", "per-mac", "--json").stdout)
    assert [r["params"] for r in doc["layers"] if r["op"] in ("conv", "linear")] == [216, 90]
    assert (doc["params"], doc["weight_bytes"]) == (PARAMS - 8, (PARAMS - 8) * 4)


def test_predict_does_not_import_torch(tmp_path):
    code = ("import sys\nfrom nasctl.cli import main\n"
            f"sys.argv = ['nasctl', 'predict', {tiny_net(tmp_path / 'tiny.onnx')!r}, '--device', 'edge-quad']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('torch', 'onnxruntime', 'pandas', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "MACs" in out and out.strip().splitlines()[-1] == "[]"


def test_predict_starts_without_the_other_commands_and_behaves_as_in_the_whole_tree(tmp_path):
    """`nasctl predict` builds an app of that one command: the other command modules are
    not loaded, and its help, output and errors are those of the whole command tree."""
    model = tiny_net(tmp_path / "tiny.onnx")
    code = ("import sys\nfrom nasctl.cli import main\n"
            f"sys.argv = ['nasctl', '--workspace', {str(tmp_path)!r}, 'predict', {model!r}, '--device', 'edge-quad']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('nasctl.cli.search', 'nasctl.cli.runs', 'nasctl.cli.tree') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.strip().splitlines()[-1] == "[]"
    nasctl = [sys.executable, "-m", "nasctl"]
    fast = subprocess.run([*nasctl, "predict", model, "--device", "edge-quad", "--json"], capture_output=True,
                          text=True, cwd=tmp_path)
    whole = invoke(model, "--device", "edge-quad", "--json")
    assert json.loads(fast.stdout) == json.loads(whole.stdout)
    bad = subprocess.run([*nasctl, "predict", model, "--device", "no-such-device"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert bad.returncode == whole_code(model) and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:")
    helps = subprocess.run([*nasctl, "predict", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert helps.returncode == 0 and "--exit-rates" in helps.stdout and "Usage: nasctl predict" in helps.stdout


def whole_code(model):
    return invoke(model, "--device", "no-such-device").exit_code


def qdq_net(path):
    """An int8 QDQ conv -> relu -> global average pool -> linear, as onnxruntime's static
    quantizer writes them."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-5, 5, s).astype(np.int8), n)
             for n, s in [("wq", (8, 3, 3, 3)), ("mq", (8, 10))]]
    inits += [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "zp")]
    q = lambda op, i, o: helper.make_node(op, [i, "s", "zp"], [o], name=o)  # noqa: E731
    nodes = [q("QuantizeLinear", "x", "xq"), q("DequantizeLinear", "xq", "xd"), q("DequantizeLinear", "wq", "wd"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             q("QuantizeLinear", "r", "rq"), q("DequantizeLinear", "rq", "rd"),
             helper.make_node("GlobalAveragePool", ["rd"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             q("QuantizeLinear", "f", "fq"), q("DequantizeLinear", "fq", "fd"), q("DequantizeLinear", "mq", "md"),
             helper.make_node("MatMul", ["fd", "md"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                              [helper.make_empty_tensor_value_info("y")], inits)
    onnx.save(onnx_model(graph, 17), path)
    return str(path)


def test_a_quantized_models_runtime_reading_starts_before_the_device_loads_and_runs_once(tmp_path, monkeypatch):
    """onnxruntime's optimized graph of a quantized model (which QDQ groups it fuses) is read
    on a thread started before the device loads, beside it, and only once; a float model
    starts none (and imports no onnxruntime: `test_predict_does_not_import_torch`)."""
    from nasctl.hardware import early, onnx_import

    events = []
    real_thread, real_runtime = early.in_thread, onnx_import._in_runtime
    monkeypatch.setattr(early, "in_thread", lambda fn, *args: events.append("read started") or real_thread(fn, *args))
    monkeypatch.setattr(onnx_import, "_in_runtime", lambda path: events.append("onnxruntime") or real_runtime(path))
    monkeypatch.setattr(loader, "load_device", lambda name: events.append("device") or PerMac())
    model = qdq_net(tmp_path / "int8.onnx")
    result = invoke(model, "--device", "per-mac", "--json")
    assert result.exit_code == 0, result.output
    assert events.index("read started") < events.index("device") and events.count("onnxruntime") == 1
    # the same layers as an import that starts its own reading
    doc = json.loads(result.stdout)
    alone = onnx_import.import_onnx(model)
    assert [(r["op"], r["bits"]["w"], r["bits"]["a"], r["dequantized"]) for r in doc["layers"]] == [
        (l.op, l.w_bits, l.a_bits, l.dequantized) for l in alone.layers]
    assert [l.op for l in alone.layers] == ["conv", "pool", "linear"] and alone.layers[0].w_bits == 8

    events.clear()
    assert invoke(tiny_net(tmp_path / "float.onnx"), "--device", "per-mac").exit_code == 0
    assert events == ["device"]


def test_a_model_is_read_as_quantized_by_its_dequantize_nodes_alone(tmp_path):
    from nasctl.hardware.early import quantized

    assert quantized(qdq_net(tmp_path / "int8.onnx")) and not quantized(tiny_net(tmp_path / "float.onnx"))
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert not quantized(tmp_path / "empty.onnx") and not quantized(tmp_path / "missing.onnx")
    assert not quantized(tmp_path)  # a folder
    # the model's own errors are still the importer's one line
    result = invoke(str(tmp_path / "missing.onnx"), "--device", "edge-quad")
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_layers_priced_from_another_kernels_rows_are_named_in_one_warning(tmp_path, monkeypatch):
    """A profiled table without rows of a layer's kernel prices it as a kernel it is told
    apart from (here a grouped conv as a dense one; an int8 max pool run channels-first as
    a channels-last one, 30x faster): `nasctl predict` names such layers in one warning
    and in its JSON (`stand_ins`), and says nothing where the table has rows of their own."""
    from nasctl.hardware.layers import LayerSpec
    from nasctl.hardware.lut import LutDevice, LutSpec, row_from_layer

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="grouped", group=2, pads=[1, 1, 1, 1])],
                              "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 16, 16, 16])],
                              [helper.make_empty_tensor_value_info("y")], [w])
    onnx.save(onnx_model(graph, 17), tmp_path / "g.onnx")

    def conv(c, hw, groups=1):
        return LayerSpec("conv", c, c, (hw, hw), (hw, hw), (3, 3), 1, groups)

    dense = [row_from_layer(conv(c, hw), 1e-3 + conv(c, hw).macs * 1e-8) for c in (8, 16, 32) for hw in (8, 16, 32)]
    grouped = [row_from_layer(conv(c, hw, 2), 1e-3 + conv(c, hw, 2).macs * 3e-8) for c in (8, 16, 32) for hw in (8, 16)]
    for rows, named in ((dense, [{"kernel": "conv_g", "priced_as": "conv", "count": 1}]), (dense + grouped, [])):
        table = LutDevice(LutSpec.model_validate({"name": "table", "kind": "lut"}), rows)
        monkeypatch.setattr(loader, "load_device", lambda name: table)
        result = invoke(str(tmp_path / "g.onnx"), "--device", "table", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["stand_ins"] == named
        warnings = [line for line in result.stderr.splitlines() if "another kernel type's rows" in line]
        assert len(warnings) == len(named)
        if named:
            assert warnings[0].startswith("warning: 1 layer priced") and "(conv_g x1 as conv)" in warnings[0]
