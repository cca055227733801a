"""Runs on shared optuna storage: several workers on one study, PostgreSQL, and a worker
killed mid-run whose run `--resume` completes without losing a finished trial."""

import csv
import os
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from typer.testing import CliRunner

from nasctl.cli import app

runner = CliRunner()
POSTGRES = os.environ.get("NASCTL_TEST_POSTGRES")  # e.g. postgresql+psycopg2://user:pw@127.0.0.1/db


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table_args(path):
    return ["--space", "nb201", "--accuracy", f"table:{path}:acc", "--device", f"table:{path}:lat"]


def assert_each_trial_once(study, run, budget):
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # failed for a reason (an empty table cell), not stopped by a kill
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL and "error" in t.user_attrs]
    # failed before training (no cost in the table): not counted against the budget
    counted = [t for t in failed if t.user_attrs.get("counts", True)]
    assert budget <= len(done) + len(counted) <= budget + 1  # a worker may finish the trial it started
    archs = [t.user_attrs["arch"] for t in done + failed]
    assert len(set(archs)) == len(archs)  # no architecture evaluated twice
    rows = read_csv(run / "trials.csv")
    assert sorted(int(r["trial"]) for r in rows) == sorted(t.number for t in done)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not POSTGRES, reason="set NASCTL_TEST_POSTGRES to a PostgreSQL URL (.ci/run starts a server)"))])
def test_two_workers_on_one_study(table, tmp_path, backend):
    path, _ = table
    run, study_name = tmp_path / "run", f"two-workers-{uuid.uuid4().hex[:8]}"
    storage = f"sqlite:///{tmp_path / 'shared.db'}" if backend == "sqlite" else POSTGRES
    result = runner.invoke(app, ["search", *table_args(path), "--budget", "300", "--strategy", "random", "--workers", "2",
                                 "--storage", storage, "--study", study_name, "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name=study_name, storage=storage)
    assert_each_trial_once(study, run, 300)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert {t.user_attrs["worker"] for t in done} == {0, 1}  # both workers did trials
    if backend == "postgresql":
        optuna.delete_study(study_name=study_name, storage=storage)


def test_killed_search_resumes_without_losing_finished_trials(table, tmp_path):
    path, _ = table
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "nasctl", "search", *table_args(path), "--budget", "150", "--strategy", "random",
           "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (run / "trials.csv").exists() and len(read_csv(run / "trials.csv")) >= 20:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the search ended before it could be killed"
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: a trial in progress stays RUNNING
    proc.wait()
    before = read_csv(run / "trials.csv")
    result = runner.invoke(app, ["search", "--resume", str(run)])
    assert result.exit_code == 0, result.output
    after = read_csv(run / "trials.csv")
    assert {r["arch"]: r["accuracy"] for r in before}.items() <= {r["arch"]: r["accuracy"] for r in after}.items()
    study = optuna.load_study(study_name="run", storage=f"sqlite:///{run / 'study.db'}")
    assert_each_trial_once(study, run, 150)  # a trial the kill interrupted does not count against the budget
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.parametrize("url", ["postgresql+psycopg2://nobody:x@127.0.0.1:1/none", "nosuchdb://x"])
def test_unreachable_storage_is_one_line_and_makes_no_run_folder(tmp_path, url):
    run = tmp_path / "run"
    result = runner.invoke(app, ["search", "--budget", "1", "--storage", url, "--run-dir", str(run)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: cannot open storage '{url}'")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not run.exists()
