"""Table-backed searches (`table:PATH:COLUMN`) and surrogate-assisted search, through the
CLI, on a small synthetic NB201 table: accuracy rises with 3x3 convs, latency with every
conv."""

import csv
import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.spaces.loader import load_space

runner = CliRunner()


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def table(tmp_path):
    """Every NB201 cell with `acc` and `lat`, except that cells whose first edge is an
    average pooling have an empty `lat` cell; returns (path, rows)."""
    space = load_space("nb201")
    rng = np.random.default_rng(0)
    names = [v.name for v in space.variables()]
    rows = []
    for ops in itertools.product(*(v.choices for v in space.variables())):
        text = space.format_arch(dict(zip(names, ops)))
        acc = 80 + 2.5 * ops.count("nor_conv_3x3") + ops.count("nor_conv_1x1") + rng.normal(0, 0.3)
        lat = 1 + 0.4 * ops.count("nor_conv_3x3") + 0.1 * ops.count("nor_conv_1x1")
        rows.append({"arch_str": text, "acc": round(acc, 3), "lat": "" if ops[0] == "avg_pool_3x3" else lat})
    path = tmp_path / "bench.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["arch_str", "acc", "lat"])
        w.writeheader()
        w.writerows(rows)
    return path, rows


def failed_trials(run):
    import optuna

    study = optuna.load_study(study_name=run.name, storage=f"sqlite:///{run / 'study.db'}")
    return [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]


def table_search(path, *args):
    return runner.invoke(app, ["search", "--space", "nb201", "--accuracy", f"table:{path}:acc",
                               "--device", f"table:{path}:lat", *args])


def test_table_search_records_missing_rows_as_failed_and_goes_on(table, tmp_path):
    path, rows = table
    run = tmp_path / "run"
    result = table_search(path, "--budget", "40", "--strategy", "random", "--run-dir", str(run), "--json")
    assert result.exit_code == 0, result.output
    trials = read_csv(run / "trials.csv")
    known = {r["arch_str"]: r for r in rows}
    space = load_space("nb201")
    for t in trials:
        r = known[space.format_arch(json.loads(t["arch"]))]
        assert float(t["accuracy"]) == pytest.approx(r["acc"]) and float(t["latency_ms"]) == pytest.approx(r["lat"])
    failed = failed_trials(run)
    # the budget counts table queries: a candidate with an empty cell is a failed trial
    assert failed and len(failed) + len(trials) == 40
    for t in failed:
        assert json.loads(t.user_attrs["arch"])["edge_1_0"] == "avg_pool_3x3"
        assert "has no 'lat'" in t.user_attrs["error"]


@pytest.mark.parametrize("spec, message", [
    ("table:{path}:nope", "has no column 'nope'; its columns: acc, lat"),
    ("table:{missing}:acc", "does not exist"),
    ("table:{path}", "is not of the form table:PATH:COLUMN"),
])
def test_bad_table_is_one_line(table, tmp_path, spec, message):
    path, _ = table
    result = runner.invoke(app, ["search", "--space", "nb201", "--device", f"table:{path}:lat", "--accuracy",
                                 spec.format(path=path, missing=tmp_path / "missing.csv")])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_surrogate_screens_proposals_and_logs_kendall_tau(table, tmp_path):
    path, _ = table
    run = tmp_path / "run"
    result = table_search(path, "--budget", "30", "--strategy", "random", "--surrogate", "ridge", "--screen", "4",
                          "--seed", "1", "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    # the budget counts real evaluations only (those with an empty cell fail)
    assert len(read_csv(run / "trials.csv")) + len(failed_trials(run)) == 30
    log = read_csv(run / "surrogate.csv")
    assert log and [int(r["refit"]) for r in log] == list(range(1, len(log) + 1))
    assert int(log[0]["trials"]) >= 10  # the first refit waits for 10 finished trials
    for r in log:
        assert int(r["evaluated"]) <= -(-int(r["proposed"]) // 4)  # one real evaluation in `screen` proposals
    # the synthetic accuracy is nearly linear in the ops: ridge ranks it well
    assert float(log[-1]["kendall_tau_so_far"]) > 0.5


def test_surrogate_search_is_deterministic(table, tmp_path):
    path, _ = table
    args = ["--budget", "24", "--surrogate", "ridge", "--seed", "2"]
    for name in ("a", "b"):
        assert table_search(path, *args, "--run-dir", str(tmp_path / name)).exit_code == 0
    arch = [[t["arch"] for t in read_csv(tmp_path / name / "trials.csv")] for name in ("a", "b")]
    assert arch[0] == arch[1]


def test_unknown_surrogate_is_one_line_before_any_run(table, tmp_path):
    path, _ = table
    result = table_search(path, "--surrogate", "oracle")
    assert result.exit_code == 2
    assert "unknown predictor model 'oracle'; allowed:" in result.output and "ridge" in result.output
    assert not (tmp_path / "runs").exists()
