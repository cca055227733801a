"""Table-backed searches (`table:PATH:COLUMN`) and surrogate-assisted search, through the
CLI, on the synthetic NB201 table of conftest.py."""

import csv
import json

import pytest
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.spaces.loader import load_space

runner = CliRunner()


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


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
    result = table_search(path, "--budget", "60", "--strategy", "random", "--surrogate", "ridge", "--screen", "4",
                          "--seed", "1", "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    # the budget counts real evaluations only (those with an empty cell fail)
    assert len(read_csv(run / "trials.csv")) + len(failed_trials(run)) == 60
    log = read_csv(run / "surrogate.csv")
    assert log and [int(r["refit"]) for r in log] == list(range(1, len(log) + 1))
    assert int(log[0]["trials"]) >= 10  # the first refit waits for 10 finished trials
    for r in log:
        assert int(r["evaluated"]) <= -(-int(r["proposed"]) // 4)  # one real evaluation in `screen` proposals
    # the synthetic accuracy is nearly linear in the ops: ridge ranks what it screens in
    # (a surrogate that ranked at random would score about 0)
    assert float(log[-1]["kendall_tau_so_far"]) > 0.4


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
