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
    # a candidate with an empty cost cell fails before training (a failed trial, said so
    # in the output), and does not count against the budget: 40 trials were evaluated
    assert failed and len(trials) == 40
    for t in failed:
        assert json.loads(t.user_attrs["arch"])["edge_1_0"] == "avg_pool_3x3"
        assert "cannot be priced" in t.user_attrs["error"] and "has no 'lat'" in t.user_attrs["error"]
    doc = json.loads(result.stdout)
    assert doc["failed"] == len(failed)
    assert any(f"{len(failed)} trial(s) failed: cannot be priced" in note for note in doc["notes"])


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
    # the budget counts real evaluations only; those with an empty cost cell fail without counting
    trials = read_csv(run / "trials.csv")
    assert len(trials) == 60
    # screening ranks only candidates it can price: after the warm-up's 10 trials, none of
    # the cells without a latency (a fifth of the table) is evaluated
    warmup_end = sorted(int(t["trial"]) for t in trials)[9]
    assert [t.number for t in failed_trials(run) if t.number > warmup_end] == []
    log = read_csv(run / "surrogate.csv")
    assert log and [int(r["refit"]) for r in log] == list(range(1, len(log) + 1))
    assert int(log[0]["trials"]) >= 10  # the first refit waits for 10 finished trials
    for r in log:
        assert int(r["evaluated"]) <= -(-int(r["proposed"]) // 4)  # one real evaluation in `screen` proposals
    # the synthetic accuracy is nearly linear in the ops: ridge ranks what it screens in
    # (a surrogate that ranked at random would score about 0)
    assert float(log[-1]["kendall_tau_so_far"]) > 0.4


def test_a_one_at_a_time_strategy_proposes_screen_candidates_per_real_evaluation(table, tmp_path):
    path, _ = table
    run = tmp_path / "run"
    result = table_search(path, "--budget", "30", "--strategy", "tpe", "--surrogate", "ridge", "--screen", "4",
                          "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    log = read_csv(run / "surrogate.csv")
    # a refit every 5 real evaluations (after 10 warm-up trials): 4 x 5 proposals for
    # each (fewer for the last, where the budget has less left); one at a time, it was 1
    assert len(log) >= 2 and int(log[0]["proposed"]) == 20
    assert all(4 * int(r["evaluated"]) <= int(r["proposed"]) <= 20 for r in log)


def test_surrogate_search_is_deterministic(table, tmp_path):
    path, _ = table
    args = ["--budget", "16", "--surrogate", "ridge", "--seed", "2"]
    for name in ("a", "b"):
        assert table_search(path, *args, "--run-dir", str(tmp_path / name)).exit_code == 0
    arch = [[t["arch"] for t in read_csv(tmp_path / name / "trials.csv")] for name in ("a", "b")]
    assert arch[0] == arch[1]
    assert read_csv(tmp_path / "a" / "surrogate.csv")  # the surrogate screened some of them


def test_unknown_surrogate_is_one_line_before_any_run(table, tmp_path):
    path, _ = table
    result = table_search(path, "--surrogate", "oracle")
    assert result.exit_code == 2
    assert "unknown predictor model 'oracle'; allowed:" in result.output and "ridge" in result.output
    assert not (tmp_path / "runs").exists()


def test_search_scores_with_a_saved_predictor(table, tmp_path, monkeypatch):
    (tmp_path / "ws").mkdir()
    monkeypatch.setenv("NASCTL_WORKSPACE", str(tmp_path / "ws"))
    path, _ = table
    trained = runner.invoke(app, ["predictor", "train", "--space", "nb201", "--data", f"table:{path}:acc",
                                  "--model", "ridge", "--name", "synth"])
    assert trained.exit_code == 0, trained.output
    run = tmp_path / "run"
    result = runner.invoke(app, ["search", "--space", "nb201", "--accuracy", "predictor:synth", "--device",
                                 f"table:{path}:lat", "--budget", "12", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    from nasctl.predictors import load_predictor

    space = load_space("nb201")
    trials = read_csv(run / "trials.csv")
    predicted = load_predictor("synth", space=space).predict([json.loads(t["arch"]) for t in trials])[0]
    assert [float(t["accuracy"]) for t in trials] == pytest.approx(predicted, rel=1e-5)
    wrong = runner.invoke(app, ["search", "--accuracy", "predictor:synth", "--budget", "1"])
    assert wrong.exit_code == 2 and "was trained for space 'nb201', not 'ee-mbv2'" in wrong.stderr


def test_a_predictor_of_exit_rates_prices_early_exits_without_training(tmp_path, monkeypatch):
    (tmp_path / "ws").mkdir()
    monkeypatch.setenv("NASCTL_WORKSPACE", str(tmp_path / "ws"))
    import numpy as np

    from nasctl.spaces.base import arch_key

    space = load_space("ee-mbv2")
    rng = np.random.default_rng(0)
    with open(tmp_path / "runs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch", "accuracy", "exit_rate_s1", "exit_rate_s2"])
        for _ in range(60):
            arch = space.sample(rng)
            s1 = 0.4 if arch["exit_s1"] else 0.0  # every early exit takes a fixed share
            s2 = 0.3 if arch["exit_s2"] else 0.0
            w.writerow([arch_key(arch), 90 - 5 * (arch["backbone_bits"] == 4), s1, s2])
    trained = runner.invoke(app, ["predictor", "train", "--space", "ee-mbv2", "--data", str(tmp_path / "runs.csv"),
                                  "--target", "accuracy,exit_rate_s1,exit_rate_s2", "--model", "ridge",
                                  "--name", "ee"])
    assert trained.exit_code == 0, trained.output
    run = tmp_path / "run"
    result = runner.invoke(app, ["search", "--accuracy", "predictor:ee", "--budget", "10", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    for t in read_csv(run / "trials.csv"):
        arch = json.loads(t["arch"])
        rates = {e: float(t[f"exit_rate_{e}"]) for e in ("s1", "s2", "final")}
        assert sum(rates.values()) == pytest.approx(1.0, abs=1e-5)  # trials.csv holds 6 digits
        assert rates["s1"] == pytest.approx(0.4 if arch["exit_s1"] else 0.0, abs=0.1)
        assert rates["s2"] == pytest.approx(0.3 if arch["exit_s2"] else 0.0, abs=0.1)
        assert float(t["train_s"]) < 1  # nothing was trained


def test_accuracy_floor_from_a_baseline_run(table, tmp_path):
    path, _ = table
    base = tmp_path / "baseline"
    assert table_search(path, "--budget", "20", "--seed", "1", "--run-dir", str(base)).exit_code == 0
    best = max(float(t["accuracy"]) for t in read_csv(base / "trials.csv") if t["feasible"] == "true")
    run = tmp_path / "run"
    result = table_search(path, "--budget", "20", "--accuracy-baseline", str(base), "--max-accuracy-drop", "5",
                          "--run-dir", str(run), "--json")
    assert result.exit_code == 0, result.output
    floor = best - 5
    assert f"accuracy >= {floor:g}" in json.loads(result.stdout)["constraints"]
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["resolved"]["min_accuracy"] == pytest.approx(floor)
    trials = read_csv(run / "trials.csv")
    assert any(float(t["accuracy"]) < floor for t in trials)  # some fall below the floor ...
    for t in trials:  # ... and exactly those are infeasible
        assert (t["feasible"] == "true") == (float(t["accuracy"]) >= floor)
    assert all(float(r["accuracy"]) >= floor for r in read_csv(run / "pareto.csv"))


@pytest.mark.parametrize("args, code, message", [
    (["--min-accuracy", "99.9"], 1, "no evaluated candidate meets accuracy >= 99.9 (best seen"),
    (["--min-accuracy", "120"], 2, "--min-accuracy 120.0: Input should be less than or equal to 100"),
    (["--min-accuracy", "80", "--accuracy-baseline", "no-such-run"], 2, "give min_accuracy or accuracy_baseline"),
    (["--accuracy-baseline", "no-such-run"], 2, "run 'no-such-run' not found"),
])
def test_accuracy_floor_errors_are_one_line(table, args, code, message):
    path, _ = table
    result = table_search(path, "--budget", "8", *args)
    assert result.exit_code == code, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_search_that_runs_out_of_architectures_says_how_much_budget_is_left(table, tmp_path):
    path, _ = table
    pins = "edge_1_0=skip_connect,edge_2_0=skip_connect,edge_2_1=skip_connect,edge_3_0=skip_connect,edge_3_1=none"
    result = table_search(path, "--budget", "8", "--strategy", "random", "--pin", pins,
                          "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert len(read_csv(tmp_path / "run" / "trials.csv")) == 5  # the pinned space holds five cells
    assert "note: 3 of the budget's 8 trials unused: strategy 'random' proposed nothing new" in result.stderr
    done = table_search(path, "--budget", "5", "--strategy", "random", "--pin", pins, "--run-dir",
                        str(tmp_path / "run5"), "--json")
    assert json.loads(done.stdout)["unused_budget"] == 0 and "note:" not in done.stderr


def test_candidates_the_surrogate_passed_over_stay_eligible(table, tmp_path):
    # 25 cells; the strategy proposes them all in the first two rounds, ten per real evaluation
    path, _ = table
    pins = "edge_1_0=skip_connect,edge_2_0=nor_conv_3x3,edge_2_1=skip_connect,edge_3_0=skip_connect"
    run = tmp_path / "run"
    result = table_search(path, "--budget", "20", "--strategy", "random", "--surrogate", "ridge", "--screen", "10",
                          "--pin", pins, "--run-dir", str(run))
    assert result.exit_code == 0, result.output
    assert len(read_csv(run / "trials.csv")) == 20 and "unused" not in result.stderr
    assert sum(int(r["evaluated"]) for r in read_csv(run / "surrogate.csv")) == 10  # after the 10 warm-up trials


@pytest.mark.parametrize("edit, message", [
    (lambda rows: rows[4].update(acc="good"), "line 6: acc 'good' is not a number"),
    (lambda rows: rows[0].update(acc=917.5), "line 2: acc 917.5 is out of range; allowed: 0 to 100"),
    (lambda rows: rows[1].update(acc=float("inf")), "line 3: acc inf is out of range"),
    (lambda rows: rows.append({**rows[2], "acc": 0.0}), "the architecture of line 4 again, with another acc"),
    (lambda rows: rows[0].update(arch_str="|bogus~0|"), "line 2: '|bogus~0|' is not an NB201 architecture"),
])
def test_bad_table_values_are_one_line_naming_the_line(table, tmp_path, edit, message):
    path, rows = table
    rows = [dict(r) for r in rows]
    edit(rows)
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as f:
        w = csv.DictWriter(f, ["arch_str", "acc", "lat"])
        w.writeheader()
        w.writerows(rows)
    result = runner.invoke(app, ["search", "--space", "nb201", "--device", f"table:{path}:lat", "--accuracy",
                                 f"table:{bad}:acc", "--budget", "1", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_an_energy_bound_on_a_latency_table_is_one_line(table, tmp_path):
    path, _ = table
    result = table_search(path, "--objectives", "accuracy,latency_ms", "--max-energy-mj", "1", "--budget", "1",
                          "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert "models latency only; --max-energy-mj needs a device that models energy" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
