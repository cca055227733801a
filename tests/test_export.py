"""From a front point to a deployed model: kept weights, `nasctl export`, `nasctl eval` and
`nasctl predict` on the exported graph."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from tests.cli.cli_helpers import SMALL_SPACE, SMALL_VIT, invoke, one_line_error

ROOT = Path(__file__).resolve().parents[1]


from nasctl.hardware.onnx_import import all_nodes as _nodes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small search whose trials cover 32-, 8- and 4-bit backbones and exit heads."""
    from nasctl.config import make_config
    from nasctl.engine import run_search

    folder = tmp_path_factory.mktemp("export") / "run"
    result = run_search(make_config(None, "setting", space=SMALL_SPACE, budget=6, epochs=4, seed=3, workers=1), folder)
    return result


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    """A small vision-transformer search whose trials cover 32-, 8- and 4-bit backbones,
    attention and exit heads, with and without the stem, at both patch sizes."""
    from nasctl.config import make_config
    from nasctl.engine import run_search

    folder = tmp_path_factory.mktemp("export-vit") / "run"
    # trained on the CPU: the exported graph is compared with it bit for bit on onnxruntime's CPU
    return run_search(make_config(None, "setting", space=SMALL_VIT, budget=8, epochs=5, seed=6, workers=1,
                                  train_device="cpu"), folder)


def _export(run, trial, out, *extra):
    res = invoke("export", run.run_dir, "--trial", trial, "--out", out, "--json", *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_a_search_keeps_each_trained_network_loadable_as_a_state_dict(run):
    import torch

    from nasctl.evaluation import kept
    from nasctl.spaces.base import arch_key
    from nasctl.spaces.loader import load_space

    space = load_space(SMALL_SPACE)
    assert len(list((run.run_dir / "models").iterdir())) == len(run.trials)
    for row in run.trials:
        arch = json.loads(row["arch"])
        folder = kept.folder_of(run.run_dir, arch_key(arch))
        meta = kept.read_meta(folder)
        state = torch.load(folder / "model.pt", weights_only=True)
        net = space.build(arch, tuple(meta["input_shape"]), meta["classes"])
        net.load_state_dict(state)  # every tensor of the network, QAT ranges included
        assert meta["figures"]["accuracy"] == pytest.approx(row["accuracy"], abs=1e-3)
        assert meta["exits"] == space.active_exits(arch) and len(meta["thresholds"]) == len(meta["exits"]) - 1
        assert meta["normalisation"] == {"divide": 16.0} and meta["dataset"] == {"name": "digits", "split_seed": 3}


def test_every_front_trial_exports_and_runs_as_it_was_evaluated(run, tmp_path):
    """eval reproduces the trial's accuracy and exit rates (within 0.5 points), predict with
    the card its recorded latency and energy on edge-quad (within 0.5%), and the layers
    read back from the graph, bit widths included, are the space's."""
    from nasctl.hardware.onnx_import import import_onnx
    from nasctl.spaces.loader import load_space

    space = load_space(SMALL_SPACE)
    for row in run.front:
        out = tmp_path / f"t{row['trial']}"
        card = _export(run, row["trial"], out)
        res = invoke("eval", out, "--rounds", 2, "--json")
        assert res.exit_code == 0, res.output
        ev = json.loads(res.stdout)
        assert abs(ev["accuracy"] - row["accuracy"]) <= 0.5
        for e in card["exits"]:
            assert abs(100 * ev["exit_rates"][e] - 100 * row[f"exit_rate_{e}"]) <= 0.5, e
        assert set(ev["latency_ms"]["per_exit"]) == set(card["exits"])
        res = invoke("predict", out / "model.onnx", "--device", "edge-quad", "--json")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)  # a model with exits: over the card's exit rates
        expected = doc["expected"] if len(card["exits"]) > 1 else doc
        assert expected["latency_ms"] == pytest.approx(row["latency_ms"], rel=5e-3)
        assert expected["energy_mj"] == pytest.approx(row["energy_mj"], rel=5e-3)
        arch = json.loads(row["arch"])
        want = space.to_layers(arch, (1, 8, 8), 10)
        got = import_onnx(out / "model.onnx").layers
        fields = lambda l: (l.op, l.in_ch, l.out_ch, l.in_hw, l.out_hw, l.kernel, l.stride, l.groups,  # noqa: E731
                            l.w_bits, l.a_bits, l.segment, l.role, l.fn if l.op == "add" else "")
        assert [fields(l) for l in got] == [fields(l) for l in want]


def test_the_graph_skips_the_rest_of_the_backbone_once_an_exit_is_taken(run, tmp_path):
    """Each early exit is an If whose else branch holds everything after it: a taken exit
    computes only the backbone up to it and the heads passed."""
    from nasctl.spaces.loader import load_space

    space = load_space(SMALL_SPACE)
    row = next(r for r in run.trials if len(space.active_exits(json.loads(r["arch"]))) > 1)
    _export(run, row["trial"], tmp_path / "x")
    m = onnx.load(tmp_path / "x" / "model.onnx")
    layers = space.to_layers(json.loads(row["arch"]), (1, 8, 8), 10)
    convs = lambda g: sum(n.op_type in ("Conv", "Gemm") for n in g.node)  # noqa: E731
    main_ifs = [n for n in m.graph.node if n.op_type == "If"]
    assert len(main_ifs) == 1 and main_ifs[0].name.startswith("exit_")
    # the main graph computes segment 0 and its head only
    assert convs(m.graph) == sum(l.op in ("conv", "linear") and l.segment == 0 for l in layers)
    else_branch = next(a.g for a in main_ifs[0].attribute if a.name == "else_branch")
    assert sum(n.op_type in ("Conv", "Gemm") for n in _nodes(else_branch)) == \
        sum(l.op in ("conv", "linear") and l.segment > 0 for l in layers)
    # the exit index tells which exit answered
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "x" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, exit_index = sess.run(None, {"input": np.zeros((1, 1, 8, 8), np.float32)})
    assert logits.shape == (1, 10) and exit_index.dtype == np.int64 and 0 <= exit_index[0] < len(
        space.active_exits(json.loads(row["arch"])))


def test_quantized_layers_export_as_qdq_of_their_bit_widths_and_fuse_where_the_graph_allows(run, tmp_path):
    from nasctl.hardware.onnx_import import _in_runtime

    seen = set()
    for row in run.trials:
        arch = json.loads(row["arch"])
        out = tmp_path / f"t{row['trial']}"
        _export(run, row["trial"], out)
        m = onnx.load(out / "model.onnx")
        init = {i.name: i.data_type for i in m.graph.initializer}
        nodes = list(_nodes(m.graph))
        producer = {o: n for n in nodes for o in n.output}
        consumers = {}
        for n in nodes:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        apart = _in_runtime(out / "model.onnx").float_nodes
        for n in nodes:
            if n.op_type not in ("Conv", "Gemm"):
                continue
            stage = n.name.startswith("exit_")
            bits = arch["exit_bits"] if stage else arch["backbone_bits"]
            w = producer.get(n.input[1])
            if bits == 32:
                assert w is None and init[n.input[1]] == onnx.TensorProto.FLOAT
                continue
            assert w.op_type == "DequantizeLinear"
            assert init[w.input[0]] == {8: onnx.TensorProto.UINT8, 4: onnx.TensorProto.INT4}[bits]
            seen.add(bits)
            x = producer.get(n.input[0])
            reads_8bit = x is not None and x.op_type == "DequantizeLinear" and \
                init.get(x.input[2], None) == onnx.TensorProto.UINT8
            writes = consumers.get(n.output[0], [])
            if n.op_type == "Conv" and bits == 8 and reads_8bit and writes and \
                    all(c.op_type in ("QuantizeLinear", "Clip") for c in writes):
                # an 8-bit conv between 8-bit activations: onnxruntime runs it as an integer kernel
                assert (n.name, "Conv") not in apart, n.name
    assert seen == {8, 4}


def test_retrain_trains_from_scratch_on_train_and_validation_and_recalibrates(run, tmp_path):
    from nasctl.spaces.loader import load_space

    space = load_space(SMALL_SPACE)
    row = next(r for r in run.trials if len(space.active_exits(json.loads(r["arch"]))) > 1)
    card = _export(run, row["trial"], tmp_path / "r", "--retrain", "--epochs", 3)
    model = card["figures"]["model"]
    assert model["trained_on"] == "train+validation" and model["epochs"] == 3
    assert card["figures"]["run"]["accuracy"] == pytest.approx(row["accuracy"], abs=1e-3)
    res = invoke("eval", tmp_path / "r", "--rounds", 2, "--json")
    ev = json.loads(res.stdout)
    assert abs(ev["accuracy"] - model["accuracy"]) <= 0.5
    assert set(card["thresholds"]) == set(card["exits"][:-1])
    # predict prices it with its own exit rates
    res = invoke("predict", tmp_path / "r" / "model.onnx", "--device", "edge-quad", "--json")
    assert json.loads(res.stdout)["expected"]["exit_rates"] == pytest.approx(model["exit_rates"])


def test_keep_weights_front_keeps_only_the_front_and_none_keeps_nothing(tmp_path):
    from nasctl.config import make_config
    from nasctl.engine import run_search

    small = dict(space=SMALL_SPACE, epochs=1)
    front = run_search(make_config(None, "setting", **small, budget=3, seed=1, keep_weights="front"), tmp_path / "f")
    assert len(list((tmp_path / "f" / "models").iterdir())) == len(front.front)
    two = run_search(make_config(None, "setting", **small, budget=2, seed=2, workers=2), tmp_path / "w")
    assert len(list((tmp_path / "w" / "models").iterdir())) == len(two.trials) == 2  # workers keep theirs
    none = run_search(make_config(None, "setting", **small, budget=1, seed=1, keep_weights="none"), tmp_path / "n")
    assert not (tmp_path / "n" / "models").exists()
    one_line_error(invoke("export", none.run_dir, "--trial", 0), 2, "--keep-weights none")
    # a resumed run keeps the weights of the trials it adds
    res = invoke("search", "--budget", 3, "--epochs", 1, "--seed", 1, "--resume", tmp_path / "f")
    assert res.exit_code == 0, res.output
    rows = [r for r in (tmp_path / "f" / "trials.csv").read_text().splitlines()[1:]]
    assert len(rows) == 3


def test_bad_input_is_one_line(run, tmp_path):
    one_line_error(invoke("export", run.run_dir, "--trial", 99), 2, "no finished trial 99")
    one_line_error(invoke("export", run.run_dir, "--trial", 0, "--epochs", 3), 2, "--retrain")
    # a corrupt kept model.pt
    from nasctl.evaluation import kept
    from nasctl.spaces.base import arch_key

    copy = tmp_path / "copy"
    shutil.copytree(run.run_dir, copy)
    row = run.trials[0]
    weights = kept.folder_of(copy, arch_key(json.loads(row["arch"]))) / "model.pt"
    weights.write_bytes(b"not a torch file")
    one_line_error(invoke("export", copy, "--trial", row["trial"]), 2, "has changed")
    # an export folder with a changed file, or without a card
    out = tmp_path / "e"
    _export(run, row["trial"], out)
    with open(out / "model.onnx", "ab") as f:
        f.write(b"\0")
    one_line_error(invoke("eval", out), 2, "has changed since it was exported")
    (out / "card.yaml").unlink()
    one_line_error(invoke("eval", out), 2, "not an export folder")


def test_an_export_is_not_written_over_another_trials_or_into_a_file(run, tmp_path):
    first, second = run.trials[0]["trial"], run.trials[1]["trial"]
    out = tmp_path / "e"
    _export(run, first, out)
    before = (out / "model.onnx").read_bytes()
    one_line_error(invoke("export", run.run_dir, "--trial", second, "--out", out), 2,
                   f"holds the export of trial {first} of run")
    assert (out / "model.onnx").read_bytes() == before
    _export(run, first, out)  # the same trial again: replaced
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(invoke("export", run.run_dir, "--trial", first, "--out", afile), 2, "is a file, not a folder")
    one_line_error(invoke("export", run.run_dir, "--trial", first, "--out", afile / "sub"), 2,
                   "cannot write the export to --out")
    # retraining on data of another shape is refused before it starts, and leaves no empty folder
    rgb = tmp_path / "rgb.npz"
    np.savez(rgb, x_train=np.zeros((40, 32, 32, 3), np.uint8), y_train=np.arange(40) % 10,
             x_test=np.zeros((10, 32, 32, 3), np.uint8), y_test=np.arange(10))
    one_line_error(invoke("export", run.run_dir, "--trial", first, "--out", tmp_path / "new", "--retrain",
                          "--dataset", rgb), 2, "has inputs [3, 32, 32] and 10 classes; the model takes [1, 8, 8]")
    assert not (tmp_path / "new").exists()
    # an export card with a split seed out of range
    card = yaml.safe_load((out / "card.yaml").read_text(encoding="utf-8"))
    card["dataset"]["split_seed"] = -5
    (out / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
    one_line_error(invoke("eval", out), 2, "split_seed -5 is not a whole number in 0")


def test_a_failed_trial_is_refused_in_one_line(tmp_path):
    """A candidate the device cannot price fails; exporting it says so."""
    import optuna

    from nasctl.config import make_config
    from nasctl.engine import run_search

    result = run_search(make_config(None, "setting", space=SMALL_SPACE, budget=2, epochs=1, seed=5), tmp_path / "run")
    study = optuna.load_study(study_name="run", storage=f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    trial = study.ask()
    trial.set_user_attr("error", "device 'edge-quad' cannot price op(s) x")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    one_line_error(invoke("export", result.run_dir, "--trial", trial.number), 2, "failed")


def test_report_shows_exported_models_with_their_eval_figures(run, tmp_path):
    from nasctl import runs
    from nasctl.report import write_report

    row = run.front[0]
    _export(run, row["trial"], tmp_path / "m")
    ev = json.loads(invoke("eval", tmp_path / "m", "--rounds", 2, "--json").stdout)
    page = write_report(runs.load(run.run_dir), out_dir=tmp_path / "report").read_text()
    section = page.split("<h2>Exported models</h2>", 1)[1]
    assert str(tmp_path / "m") in section and f"{ev['accuracy']:.2f}" in section


# Layers the trained network computes in float before its first activation quantizer (the
# patch tokens and their position) or from float scores (the softmax, whose probabilities
# are then quantized): the exported graph runs them in float as well, where the search
# prices them at the block's bit width, as an integer accelerator would run them.
FLOAT_IN_GRAPH = ("tokens", "position", "softmax")


def test_a_vision_transformer_exports_and_runs_as_it_was_evaluated(vit_run, tmp_path):
    """Every trial of a small ee-vit search exports. Run by onnxruntime without graph
    optimizations, the graph gives every test input but at most 3 of 359 the class and the
    exit the trained network gave it (all of them on an AMD EPYC); with them (`nasctl
    eval`), accuracy and exit rates stay within 1 point of the trial's where the attention
    has 8 or 32 bits.  (With 4-bit attention they moved
    by up to 2.2 and 4.5 points: onnxruntime reorders float sums - a MatMul and its bias
    become one Gemm - and 4-bit q, k, v and attention probabilities turn such last-bit
    changes into other levels.)  A taken exit skips the rest, and the layers read back
    from the graph are the space's (bit widths as trained)."""
    import onnxruntime as ort

    from nasctl.evaluation.datasets import load_dataset
    from nasctl.hardware.onnx_import import import_onnx
    from nasctl.spaces.loader import load_space

    data = load_dataset("digits", 6)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

    space = load_space(SMALL_VIT)
    archs = [json.loads(r["arch"]) for r in vit_run.trials]
    assert {a["backbone_bits"] for a in archs} == {4, 8, 32} and {a["attn_bits"] for a in archs} >= {4, 8}
    assert {a["patch"] for a in archs} == {2, 4} and {a["conv_stem"] for a in archs} == {0, 1}
    assert any(len(space.active_exits(a)) > 1 for a in archs)
    for row, arch in zip(vit_run.trials, archs):
        out = tmp_path / f"t{row['trial']}"
        card = _export(vit_run, row["trial"], out)
        res = invoke("eval", out, "--rounds", 2, "--json")
        assert res.exit_code == 0, res.output
        ev = json.loads(res.stdout)
        if arch["attn_bits"] != 4:
            assert abs(ev["accuracy"] - row["accuracy"]) <= 1.0, (arch, ev["accuracy"], row["accuracy"])
            for e in card["exits"]:
                assert abs(100 * ev["exit_rates"][e] - 100 * row[f"exit_rate_{e}"]) <= 1.0, e
        sess = ort.InferenceSession(str(out / "model.onnx"), plain, providers=["CPUExecutionProvider"])
        answers = np.array([[int(np.argmax(logits)), int(k[0])] for logits, k in
                            (sess.run(None, {"input": x[None]}) for x in data.x_test)])
        # the same class and exit for every test input but a few: onnxruntime's kernels sum in
        # another order than torch's on some CPUs (AVX-512), and a last-bit change can cross a
        # 4-bit level or an exit's threshold (3 of 359 inputs on a Xeon, none on an EPYC)
        moved = 100 * 3 / len(data.y_test)
        assert 100 * (answers[:, 0] == data.y_test).mean() == pytest.approx(row["accuracy"], abs=moved + 1e-6), arch
        for i, e in enumerate(card["exits"]):
            assert 100 * (answers[:, 1] == i).mean() == pytest.approx(100 * row[f"exit_rate_{e}"],
                                                                      abs=moved + 1e-6), (e, arch)
        graph = import_onnx(out / "model.onnx")
        assert not graph.unsupported, graph.unsupported  # every layer priced, inside the exits' branches too
        want, got = space.to_layers(arch, (1, 8, 8), 10), graph.layers
        shape = lambda l: (l.op, l.in_ch, l.out_ch, l.in_hw, l.out_hw, l.kernel, l.stride, l.groups,  # noqa: E731
                           l.segment, l.role, l.fn)
        assert [shape(l) for l in got] == [shape(l) for l in want]
        for w, g in zip(want, got):
            float_here = w.name.rsplit(".", 1)[1] in FLOAT_IN_GRAPH
            assert (g.w_bits, g.a_bits) == ((32, 32) if float_here else (w.w_bits, w.a_bits)), w.name
        res = invoke("predict", out / "model.onnx", "--device", "edge-quad", "--json")
        assert res.exit_code == 0, res.output
        if len(card["exits"]) > 1:  # the rest of the backbone lies in the exit's else branch
            m = onnx.load(out / "model.onnx")
            main_if = next(n for n in m.graph.node if n.op_type == "If")
            else_branch = next(a.g for a in main_if.attribute if a.name == "else_branch")
            assert sum(n.op_type in ("MatMul", "Gemm") for n in m.graph.node) == \
                sum(l.op in ("linear", "matmul") and l.segment == 0 for l in want)
            assert sum(n.op_type in ("MatMul", "Gemm") for n in _nodes(else_branch)) == \
                sum(l.op in ("linear", "matmul") and l.segment > 0 for l in want)
