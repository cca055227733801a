"""`nasctl predictor models|train|predict|eval|list|show` through the CLI."""

import csv
import json

import numpy as np
import pytest
import yaml

from nasctl.predictors import load_predictor
from nasctl.predictors.encodings import encode
from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space

from cli_helpers import invoke, one_line_error


@pytest.fixture(scope="module")
def space():
    return load_space("nb201")


def write_data(path, space, n, seed=0, nb201_strings=False, column="acc"):
    """A CSV of n sampled NB201 cells with a target that grows with their path encoding."""
    rng = np.random.default_rng(seed)
    archs = [space.sample(rng) for _ in range(n)]
    y = encode(space, archs, "path") @ np.random.default_rng(7).uniform(0, 1, 84) + rng.normal(0, 0.1, n)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch", column])
        for a, v in zip(archs, y):
            w.writerow([space.format_arch(a) if nb201_strings else arch_key(a), f"{v:.6f}"])
    return path


def train(ws, data, *extra, name="acc-ridge", model="ridge"):
    return invoke("--workspace", ws, "predictor", "train", "--space", "nb201", "--data", data, "--target", "acc",
                  "--model", model, "--name", name, *extra)


def test_models_lists_every_kind():
    result = invoke("predictor", "models")
    assert result.exit_code == 0 and result.stdout.split() == ["gbt", "gcn", "gp", "mlp", "ridge"]


def test_train_list_show_predict_eval(ws, tmp_path, space):
    data = write_data(tmp_path / "train.csv", space, 80, nb201_strings=True)
    result = train(ws, data, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["rows"] == 80 and doc["metrics"]["cross_validation"]["acc"]["spearman"] > 0.8
    card = yaml.safe_load((ws / "predictors" / "acc-ridge" / "card.yaml").read_text())
    assert card["space"] == "nb201" and card["target"] == ["acc"] and card["model"] == "ridge"
    assert card["data"]["rows"] == 80 and len(card["data"]["sha256"]) == 64 and card["format"] == 1
    assert "scikit-learn" in card["versions"] and card["encoding"] == "wl"

    listed = json.loads(invoke("--workspace", ws, "predictor", "list", "--json").stdout)
    assert [(r["name"], r["model"], r["origin"]) for r in listed] == [("acc-ridge", "ridge", "workspace")]
    assert json.loads(invoke("--workspace", ws, "predictor", "show", "acc-ridge", "--json").stdout)["model"] == "ridge"

    test = write_data(tmp_path / "test.csv", space, 40, seed=1)
    out = tmp_path / "pred.csv"
    result = invoke("--workspace", ws, "predictor", "predict", "acc-ridge", "--data", test, "--out", out)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["arch", "predicted_acc"] and len(rows) == 40
    archs = [space.parse_arch(r["arch"]) for r in rows]
    expected = load_predictor(ws / "predictors" / "acc-ridge").predict(archs)[0]
    assert np.allclose([float(r["predicted_acc"]) for r in rows], expected, rtol=1e-5)

    result = invoke("--workspace", ws, "predictor", "eval", "acc-ridge", "--data", test, "--json")
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)["acc"]
    assert set(metrics) == {"kendall_tau", "spearman", "mae", "top10_precision", "rows"}
    assert metrics["spearman"] > 0.8 and metrics["rows"] == 40


def test_spread_columns_and_run_folder_and_table_sources(ws, tmp_path, space):
    run = tmp_path / "run"
    run.mkdir()
    write_data(run / "trials.csv", space, 30, column="accuracy")
    result = invoke("--workspace", ws, "predictor", "train", "--space", "nb201", "--data", run, "--target", "accuracy",
                    "--model", "gp", "--name", "from-run", "--cv", "0")
    assert result.exit_code == 0, result.output
    out = tmp_path / "pred.csv"
    assert invoke("--workspace", ws, "predictor", "predict", "from-run", "--data", run / "trials.csv",
                  "--out", out).exit_code == 0
    assert list(next(csv.DictReader(out.open()))) == ["arch", "predicted_accuracy", "std_accuracy"]
    table = write_data(tmp_path / "table.csv", space, 20)
    result = invoke("--workspace", ws, "predictor", "train", "--space", "nb201", "--data", f"table:{table}:acc",
                    "--model", "ridge", "--name", "from-table", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["target"] == ["acc"]


def test_bad_inputs_are_one_line_errors(ws, tmp_path, space):
    data = write_data(tmp_path / "d.csv", space, 12)
    bad = tmp_path / "bad.csv"
    bad.write_text(data.read_text() + '"{""edge_1_0"": ""conv_7x7""}",1.0\n')
    one_line_error(train(ws, bad), 2, "line 14")
    one_line_error(invoke("--workspace", ws, "predictor", "train", "--space", "nb201", "--data", data,
                          "--target", "top1", "--model", "ridge", "--name", "x"), 2, "has no column 'top1'")
    short = tmp_path / "short.csv"
    short.write_text("\n".join(data.read_text().splitlines()[:4]) + "\n")
    one_line_error(train(ws, short), 2, "has 3 usable rows; model 'ridge' needs at least 5")
    one_line_error(train(ws, data, model="forest"), 2, "unknown predictor model 'forest'")
    one_line_error(invoke("predictor", "train", "--space", "nb201", "--data", data, "--target", "acc",
                          "--model", "ridge", "--name", "x"), 2, "no workspace to save the predictor into")
    assert train(ws, data, "--cv", "0").exit_code == 0
    one_line_error(train(ws, data), 2, "already exists")
    mbv2_data = tmp_path / "mbv2.csv"
    arch = load_space("ee-mbv2").sample(np.random.default_rng(0))
    with mbv2_data.open("w", newline="") as f:
        csv.writer(f).writerows([["arch"], [arch_key(arch)]])
    one_line_error(invoke("--workspace", ws, "predictor", "predict", "acc-ridge", "--data", mbv2_data,
                          "--out", tmp_path / "o.csv"), 2, "unknown knob")
    one_line_error(invoke("--workspace", ws, "predictor", "show", "nope"), 2, "unknown predictor 'nope'")
    # a column named twice, a target that never changes, another target than the predictor's
    lines = data.read_text().splitlines()
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join([lines[0] + ",acc"] + [line + ",1" for line in lines[1:]]) + "\n")
    one_line_error(train(ws, twice, name="t2"), 2, "the column 'acc' appears twice")
    flat = tmp_path / "flat.csv"
    flat.write_text("\n".join([lines[0]] + [line.rsplit(",", 1)[0] + ",50" for line in lines[1:]]) + "\n")
    one_line_error(train(ws, flat, name="t3"), 2, "target 'acc' is 50 in every row")
    other = write_data(tmp_path / "other.csv", space, 12, column="edp")
    one_line_error(invoke("--workspace", ws, "predictor", "eval", "acc-ridge", "--data", f"table:{other}:edp"), 2,
                   "predicts acc; data 'table:")
    # one unreadable card: the others are still listed, the broken one named
    (ws / "predictors" / "broken").mkdir()
    (ws / "predictors" / "broken" / "card.yaml").write_bytes(b"\xff\xfe not yaml")
    result = invoke("--workspace", ws, "predictor", "list", "--json")
    assert result.exit_code == 0, result.output
    assert {r["name"]: r["model"] for r in json.loads(result.stdout)}["broken"] == "(unreadable)"
    assert "predictor 'broken' is unreadable" in result.stderr


def test_multi_target_from_a_run_folder(ws, tmp_path):
    space = load_space("ee-mbv2")
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    run.mkdir()
    with (run / "trials.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "arch", "accuracy", "exit_rate_s1", "exit_rate_final"])
        for i in range(20):
            arch = space.sample(rng)
            rate = 0.3 * arch["exit_s1"] + 0.01 * i
            w.writerow([i, arch_key(arch), 90 + arch["s1_depth"] + 0.1 * i, rate, 1 - rate])
    result = invoke("--workspace", ws, "predictor", "train", "--space", "ee-mbv2", "--data", run, "--model", "ridge",
                    "--target", "accuracy,exit_rate_s1,exit_rate_final", "--name", "ee", "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["metrics"]["training_fit"]) == {"accuracy", "exit_rate_s1", "exit_rate_final"}
    out = tmp_path / "p.csv"
    assert invoke("--workspace", ws, "predictor", "predict", "ee", "--data", run, "--out", out).exit_code == 0
    assert list(next(csv.DictReader(out.open()))) == ["arch", "predicted_accuracy", "predicted_exit_rate_s1",
                                                      "predicted_exit_rate_final"]
    result = invoke("--workspace", ws, "predictor", "eval", "ee", "--data", run, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["exit_rate_s1"]["spearman"] > 0.5


def test_listing_predictors_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from nasctl.cli import app; "
            "r = CliRunner().invoke(app, ['predictor', 'models']); assert r.exit_code == 0; "
            "r = CliRunner().invoke(app, ['predictor', 'list']); assert r.exit_code == 0; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
