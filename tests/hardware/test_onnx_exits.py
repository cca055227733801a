"""ONNX import of early-exit graphs (the If-nested form `nasctl export` writes) and
`nasctl predict` pricing each exit path, with exit rates from --exit-rates or card.yaml."""

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.hardware.base import expected_cost
from nasctl.hardware.layers import LayerSpec
from nasctl.hardware.loader import load_device
from nasctl.hardware.onnx_import import import_onnx

RNG = np.random.default_rng(0)
CLASSES = 10
# Per bit width: the weight's type, the activation's zero-point type, None for float.
QTYPES = {8: (T.INT8, T.UINT8), 4: (T.INT4, T.UINT4)}


class Builder:
    """Nodes and initializers of one graph scope, with QDQ around the weighted layers
    when `bits` is 8 or 4."""

    def __init__(self, bits, inits):
        self.bits, self.inits, self.nodes = bits, inits, []

    def add(self, op, inputs, outputs, name, **attrs):
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def init(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name, shape):
        if self.bits is None:
            return self.init(name, RNG.standard_normal(shape).astype(np.float32))
        wtype, _ = QTYPES[self.bits]
        lo, hi = (-8, 7) if self.bits == 4 else (-128, 127)
        values = RNG.integers(lo, hi + 1, size=shape).ravel().tolist()
        self.inits.append(helper.make_tensor(f"{name}_q", wtype, list(shape), values))
        self.inits.append(helper.make_tensor(f"{name}_zp", wtype, [], [0]))
        self.init(f"{name}_s", np.float32(0.02))
        return self.add("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_zp"], [name], f"{name}_dq")

    def act(self, x):
        """x through QuantizeLinear/DequantizeLinear (an activation of a quantized layer)."""
        if self.bits is None:
            return x
        _, atype = QTYPES[self.bits]
        n = f"{x}_{len(self.inits)}"
        self.inits.append(helper.make_tensor(f"{n}_zp", atype, [], [0]))
        self.init(f"{n}_s", np.float32(0.05))
        q = self.add("QuantizeLinear", [x, f"{n}_s", f"{n}_zp"], [f"{n}_q"], f"{n}_quant")
        return self.add("DequantizeLinear", [q, f"{n}_s", f"{n}_zp"], [f"{n}_d"], f"{n}_dequant")

    def conv(self, name, x, cin, cout, k=3, stride=1, relu6=True):
        w = self.weight(f"{name}_w", (cout, cin, k, k))
        b = self.init(f"{name}_b", np.zeros(cout, np.float32))
        y = self.add("Conv", [self.act(x), w, b], [name], name, pads=[k // 2] * 4, strides=[stride, stride])
        if relu6:
            lo, hi = self.init(f"{name}_lo", np.float32(0)), self.init(f"{name}_hi", np.float32(6))
            y = self.add("Clip", [y, lo, hi], [f"{name}_relu6"], f"{name}_relu6")
        return y

    def head(self, name, x, cin, width):
        """conv 1x1 -> Clip -> GlobalAveragePool -> Flatten -> Gemm: the logits."""
        c = self.conv(f"{name}.conv", x, cin, width, k=1)
        p = self.add("GlobalAveragePool", [c], [f"{name}.pool"], f"{name}.pool")
        f = self.add("Flatten", [p], [f"{name}.flat"], f"{name}.flat")
        w = self.weight(f"{name}.fc_w", (CLASSES, width))
        b = self.init(f"{name}.fc_b", np.zeros(CLASSES, np.float32))
        return self.add("Gemm", [self.act(f), w, b], [f"{name}.fc"], f"{name}.fc", transB=1)

    def decide(self, k, logits, policy):
        """The exit decision: max softmax (or negative normalised entropy) >= threshold."""
        t = self.init(f"t{k}", np.array([0.5], np.float32))
        probs = self.add("Softmax", [logits], [f"probs{k}"], f"probs{k}", axis=1)
        axes = self.init(f"axes{k}", np.array([1], np.int64))
        if policy == "max":
            conf = self.add("ReduceMax", [probs, axes], [f"conf{k}"], f"conf{k}", keepdims=0)
        else:
            eps = self.init(f"eps{k}", np.float32(1e-9))
            shifted = self.add("Add", [probs, eps], [f"shift{k}"], f"shift{k}")
            logp = self.add("Log", [shifted], [f"logp{k}"], f"logp{k}")
            plogp = self.add("Mul", [probs, logp], [f"plogp{k}"], f"plogp{k}")
            s = self.add("ReduceSum", [plogp, axes], [f"negent{k}"], f"negent{k}", keepdims=0)
            n = self.init(f"logn{k}", np.float32(np.log(CLASSES)))
            norm = self.add("Div", [s, n], [f"normneg{k}"], f"normneg{k}")
            one = self.init(f"one{k}", np.float32(1))
            conf = self.add("Add", [one, norm], [f"conf{k}"], f"conf{k}")
        return self.add("GreaterOrEqual", [conf, t], [f"take{k}"], f"take{k}")


def exit_net(path, bits=None, policy="max", names=("s1", "s2"), exits=2):
    """stem conv 3->8 | exit head 0 (8->16->10) | [if] conv 8->8 + residual add, conv 8->8 /2
    | exit head 1 (8->16->10) | [if] conv 8->16 /2 | final head (16->32->10), 16x16 input.
    `exits` 0: the same backbone as a plain graph, no exit heads."""
    inits = []

    def branch_out(b, logits, k, prefix):
        out = b.add("Identity", [logits], [f"{prefix}_logits"], f"{prefix}_logits")
        idx = b.add("Constant", [], [f"{prefix}_idx"], f"{prefix}_idx",
                    value=helper.make_tensor("v", T.INT64, [1], [k]))
        return [out, idx]

    def outs(b, names_):
        return [helper.make_tensor_value_info(names_[0], T.FLOAT, [1, CLASSES]),
                helper.make_tensor_value_info(names_[1], T.INT64, [1])]

    def if_node(b, k, cond, logits, then_out, else_b, else_out, name):
        then_b = Builder(bits, inits)
        then_outs = branch_out(then_b, logits, k, f"then{k}")
        then_g = helper.make_graph(then_b.nodes, f"then{k}", [], outs(then_b, then_outs))
        else_g = helper.make_graph(else_b.nodes, f"else{k}", [], outs(else_b, else_out))
        return b.add("If", [cond], then_out, name, then_branch=then_g, else_branch=else_g)

    main = Builder(bits, inits)
    f0 = main.conv("stem", "input", 3, 8)
    seg1 = Builder(bits, inits)
    a = seg1.conv("b1.conv", f0, 8, 8, relu6=False)
    r = seg1.add("Add", [a, f0], ["b1.add"], "b1.add")
    f1 = seg1.conv("b2.conv", r, 8, 8, stride=2)
    seg2 = Builder(bits, inits)
    f2 = seg2.conv("b3.conv", f1, 8, 16, stride=2)
    final = seg2.head("head", f2, 16, 32)
    final_out = branch_out(seg2, final, exits, "final")
    if exits == 0:
        for b in (seg1, seg2):
            main.nodes += b.nodes
        main.nodes.pop()  # the Constant
        main.nodes[-1].output[0] = "logits"
        outputs = [helper.make_tensor_value_info("logits", T.FLOAT, [1, CLASSES])]
    else:
        l0 = main.head(f"exit_{names[0]}", f0, 8, 16)
        take0 = main.decide(0, l0, policy)
        l1 = seg1.head(f"exit_{names[1]}", f1, 8, 16)
        take1 = seg1.decide(1, l1, policy)
        if_node(seg1, 1, take1, l1, ["inner_logits", "inner_idx"], seg2, final_out, f"exit_{names[1]}")
        seg1_out = ["inner_logits", "inner_idx"]
        if_node(main, 0, take0, l0, ["if_logits", "exit"], seg1, seg1_out, f"exit_{names[0]}")
        main.add("Identity", ["if_logits"], ["logits"], "logits")
        outputs = [helper.make_tensor_value_info("logits", T.FLOAT, [1, CLASSES]),
                   helper.make_tensor_value_info("exit", T.INT64, [1])]
    graph = helper.make_graph(main.nodes, "exit_net", [helper.make_tensor_value_info("input", T.FLOAT, [1, 3, 16, 16])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def rename_ifs(path, names):
    """The model at `path` with its exit If nodes (outermost first) renamed to `names`."""
    model = onnx.load(path)
    graph = model.graph
    for name in names:
        node = next(n for n in graph.node if n.op_type == "If")
        node.name = name
        graph = next(a.g for a in node.attribute if a.name == "else_branch")
    onnx.save(model, path)
    return path


def spec(op, cin, cout, hw, out_hw, kernel=(1, 1), stride=1, fn="", segment=0, role="backbone", name=""):
    return LayerSpec(op, cin, cout, hw, out_hw, kernel, stride, 1, 32, 32, segment, role, fn=fn, name=name)


def classifier(name, cin, width, hw, segment, role):
    """The layers of an exit head or the final classifier, as `_block_layers` emits them."""
    return [spec("conv", cin, width, hw, hw, fn="clip", segment=segment, role=role, name=f"{name}.conv"),
            spec("pool", width, width, hw, (1, 1), hw, fn="avg", segment=segment, role=role, name=f"{name}.pool"),
            spec("linear", width, CLASSES, (1, 1), (1, 1), segment=segment, role=role, name=f"{name}.fc")]


# The float network's layers, written out by hand, path by path.
PATH_S1 = [spec("conv", 3, 8, (16, 16), (16, 16), (3, 3), fn="clip", name="stem"),
           *classifier("exit_s1", 8, 16, (16, 16), 0, "exit")]
PATH_S2 = PATH_S1 + [spec("conv", 8, 8, (16, 16), (16, 16), (3, 3), segment=1, name="b1.conv"),
                     # the conv before it accumulates it (onnxruntime runs no Add)
                     spec("add", 8, 8, (16, 16), (16, 16), fn="sum", segment=1, name="b1.add"),
                     spec("conv", 8, 8, (16, 16), (8, 8), (3, 3), 2, fn="clip", segment=1, name="b2.conv"),
                     *classifier("exit_s2", 8, 16, (8, 8), 1, "exit")]
PATH_FINAL = PATH_S2 + [spec("conv", 8, 16, (8, 8), (4, 4), (3, 3), 2, fn="clip", segment=2, name="b3.conv"),
                        *classifier("head", 16, 32, (4, 4), 2, "backbone")]
PATHS = {"s1": PATH_S1, "s2": PATH_S2, "final": PATH_FINAL}
WEIGHTED = ("conv", "linear")


def summary(layers):
    return [(l.name, l.op, l.fn, l.segment, l.role) for l in layers]


def on_path(layers, k):
    return [l for l in layers if l.segment <= k]


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_exit_layers_segments_roles_and_names(tmp_path, bits):
    result = import_onnx(exit_net(tmp_path / "ee.onnx", bits=bits))
    assert result.exits == ["s1", "s2", "final"]
    assert not result.unsupported, result.unsupported  # the If, its branches' glue and the decisions
    # the residual add after an integer conv is no residual sum: the conv cannot accumulate it
    paths = {k: [l if bits is None or l.op != "add" else replace(l, fn="") for l in path] for k, path in PATHS.items()}
    for k, name in enumerate(result.exits):
        assert summary(on_path(result.layers, k)) == summary(paths[name]), name
    if bits is None:
        assert result.layers == PATH_FINAL  # shapes, kernels, strides, bits and bias too
        assert [l.name for l in result.layers] == [l.name for l in PATH_FINAL]
    else:  # the weighted layers at the QDQ bit width, pools and adds (read unquantized) at 32
        assert [(l.w_bits, l.a_bits) for l in result.layers] == [
            (bits, bits) if l.op in WEIGHTED else (32, 32) for l in PATH_FINAL]
        assert [replace(l, w_bits=32, a_bits=32, dequantized=False) for l in result.layers] == paths["final"]
    assert result.notes == ["6 nodes of the exits' decisions (each exit's confidence against its threshold) "
                            "are not priced"]


def test_entropy_decisions_are_not_priced(tmp_path):
    result = import_onnx(exit_net(tmp_path / "ee.onnx", policy="entropy"))
    # Softmax, Add, Log, Mul, ReduceSum, Div, Add, GreaterOrEqual per exit
    assert not result.unsupported and result.layers == PATH_FINAL
    assert len(result.notes) == 1 and result.notes[0].startswith("16 nodes of the exits' decisions")


def test_exit_names_from_if_nodes(tmp_path):
    assert import_onnx(exit_net(tmp_path / "a.onnx", names=("early", "mid"))).exits == ["early", "mid", "final"]
    path = rename_ifs(exit_net(tmp_path / "b.onnx"), ["If_0", "If_1"])
    result = import_onnx(path)
    assert result.exits == ["exit0", "exit1", "final"] and result.layers == PATH_FINAL


def test_plain_graph_unchanged(tmp_path):
    result = import_onnx(exit_net(tmp_path / "plain.onnx", exits=0))
    assert result.exits == ["final"] and not result.unsupported and result.notes == []
    assert result.layers == [replace(l, segment=0) for l in PATH_FINAL if l.role == "backbone"]


def test_sibling_branches_may_reuse_names(tmp_path):
    """Both branches of an exit If may define the same value name: each keeps its producer."""
    path = exit_net(tmp_path / "ee.onnx")
    model = onnx.load(path)
    outer = next(n for n in model.graph.node if n.op_type == "If")
    branches = {a.name: a.g for a in outer.attribute}
    then_idx = branches["then_branch"].node[1].output[0]
    branches["then_branch"].output[1].name = "idx"
    branches["then_branch"].node[1].output[0] = "idx"
    inner = next(n for n in branches["else_branch"].node if n.op_type == "If")
    inner_out = inner.output[1]
    inner.output[1] = "idx"
    branches["else_branch"].output[1].name = "idx"
    assert then_idx != "idx" and inner_out != "idx"
    onnx.save(model, path)
    result = import_onnx(path)
    assert result.layers == PATH_FINAL and not result.unsupported


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_exit_path_costs_grow_and_match_the_search_layers(tmp_path, bits):
    device = load_device("edge-quad")
    result = import_onnx(exit_net(tmp_path / "ee.onnx", bits=bits))
    lat, en = device.estimate(result.layers).exit_path_costs()
    assert len(lat) == len(en) == 3
    assert lat[0] < lat[1] < lat[2] and en[0] < en[1] < en[2]
    if bits is None:  # the same figures as the layers a search space would emit for it
        want_lat, want_en = device.estimate(PATH_FINAL).exit_path_costs()
        assert lat == pytest.approx(want_lat) and en == pytest.approx(want_en)
    for k, name in enumerate(result.exits):  # path k: the sum over its layers
        path = device.estimate(on_path(result.layers, k))
        assert lat[k] == pytest.approx(path.latency_ms) and en[k] == pytest.approx(path.energy_mj)


# --- nasctl predict ----------------------------------------------------------------

runner = CliRunner()


def predict(*args):
    return runner.invoke(app, ["predict", *map(str, args)])


def one_line_error(result, text):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and text in lines[0], result.stderr
    assert "Traceback" not in result.output


def write_card(folder, text):
    (folder / "card.yaml").write_text(text)


CARD = """\
name: ee
exits: [s1, s2, final]
figures:
  run:
    accuracy: 0.9
    exit_rates: {s1: 0.5, s2: 0.25, final: 0.25}
"""


def expected_figures(path, rates):
    device = load_device("edge-quad")
    lat, en = device.estimate(import_onnx(path).layers).exit_path_costs()
    shares = [rates.get(n, 0.0) for n in ("s1", "s2", "final")]
    latency, energy = expected_cost(lat, shares), expected_cost(en, shares)
    return lat, en, {"latency_ms": latency, "energy_mj": energy, "edp": latency * energy,
                     "exit_rates": dict(zip(("s1", "s2", "final"), shares))}


def same_expected(got, want):
    figures = ("latency_ms", "energy_mj", "edp")
    return got["exit_rates"] == want["exit_rates"] and [got[k] for k in figures] == pytest.approx(
        [want[k] for k in figures])


@pytest.mark.parametrize("bits", [None, 8])
def test_predict_exit_rates_flag(tmp_path, bits):
    path = exit_net(tmp_path / "ee.onnx", bits=bits)
    write_card(tmp_path, CARD)  # the flag wins over the card
    result = predict(path, "--device", "edge-quad", "--json", "--exit-rates", "s1=0.3, final=0.7")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    lat, en, expected = expected_figures(path, {"s1": 0.3, "final": 0.7})
    assert [e["name"] for e in doc["exits"]] == ["s1", "s2", "final"]
    assert [e["latency_ms"] for e in doc["exits"]] == pytest.approx(lat)
    assert [e["energy_mj"] for e in doc["exits"]] == pytest.approx(en)
    assert doc["exits"][-1]["latency_ms"] == pytest.approx(doc["latency_ms"])
    assert same_expected(doc["expected"], expected)
    assert doc["expected"]["exit_rates"] == {"s1": 0.3, "s2": 0.0, "final": 0.7}
    assert doc["unsupported"] == [] and doc["covered_nodes_share"] == 1.0
    assert "6 nodes of the exits' decisions" in result.stderr


def test_predict_exit_rates_from_card_and_text_output(tmp_path):
    path = exit_net(tmp_path / "ee.onnx")
    write_card(tmp_path, CARD)
    doc = json.loads(predict(path, "--device", "edge-quad", "--json").stdout)
    _, _, expected = expected_figures(path, {"s1": 0.5, "s2": 0.25, "final": 0.25})
    assert same_expected(doc["expected"], expected)
    text = predict(path, "--device", "edge-quad")
    assert text.exit_code == 0, text.output
    assert "exit paths" in text.stdout and "expected over the exit rates (s1 0.5, s2 0.25, final 0.25)" in text.stdout
    assert f"{doc['expected']['latency_ms']:.4g} ms" in text.stdout and "EDP" in text.stdout
    for e in doc["exits"]:
        assert f"{e['latency_ms']:.4g} ms" in text.stdout


def test_predict_exits_without_rates_and_plain_models(tmp_path):
    doc = json.loads(predict(exit_net(tmp_path / "ee.onnx"), "--device", "edge-quad", "--json").stdout)
    assert [e["name"] for e in doc["exits"]] == ["s1", "s2", "final"] and "expected" not in doc
    (tmp_path / "plain").mkdir()
    plain = exit_net(tmp_path / "plain" / "plain.onnx", exits=0)
    write_card(tmp_path / "plain", "not: [valid")  # a plain model's card is not read
    result = predict(plain, "--device", "edge-quad", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "exits" not in doc and "expected" not in doc


@pytest.mark.parametrize("value, text", [
    ("s1=abc", "--exit-rates 's1=abc': the share 'abc' is not a number in [0, 1]"),
    ("s1", "--exit-rates 's1': expected NAME=SHARE"),
    ("s1=0.5,", "--exit-rates '': expected NAME=SHARE"),
    ("s1=1.5", "the share '1.5' is not a number in [0, 1]"),
    ("s1=-0.1,final=1.1", "the share '-0.1' is not a number in [0, 1]"),
    ("s1=nan", "the share 'nan' is not a number in [0, 1]"),
    ("s1=0.5,s1=0.5", "exit 's1' is given twice"),
    ("s3=1", "--exit-rates: the model has no exit 's3'; its exits: s1, s2, final"),
    ("s1=0.3,final=0.3", "--exit-rates: the shares sum to 0.6, not 1"),
])
def test_predict_bad_exit_rates(tmp_path, value, text):
    one_line_error(predict(exit_net(tmp_path / "ee.onnx"), "--device", "edge-quad", "--exit-rates", value), text)


@pytest.mark.parametrize("card, text", [
    ("exits: [s1, s2, final\n", "cannot read it as YAML"),
    ("- just a list\n", "not a mapping of keys"),
    ("figures: {run: {exit_rates: {final: 1.0}}}\n", "no key 'exits'"),
    ("exits: [s1, s2, final]\nfigures: {run: {accuracy: 0.9}}\n", "no key 'figures.run.exit_rates'"),
    ("exits: [s1, final]\nfigures: {run: {exit_rates: {final: 1.0}}}\n",
     "its exits [s1, final] are not the model's [s1, s2, final]"),
    ("exits: [s1, s2, final]\nfigures: {run: {exit_rates: {s1: 0.5, final: 0.6}}}\n", "the shares sum to 1.1"),
    ("exits: [s1, s2, final]\nfigures: {run: {exit_rates: {s1: high, final: 1}}}\n",
     "the share of exit 's1' is 'high', not a number in [0, 1]"),
])
def test_predict_bad_card(tmp_path, card, text):
    path = exit_net(tmp_path / "ee.onnx")
    write_card(tmp_path, card)
    result = predict(path, "--device", "edge-quad", "--json")
    one_line_error(result, text)
    assert "card.yaml" in result.stderr
