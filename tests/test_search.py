"""End-to-end searches on tiny budgets, through the CLI as a user runs them."""

import csv
import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.errors import UsageError
from nasctl.objectives import minimisation_matrix, pareto_mask
from tests.cli.cli_helpers import SMALL_SPACE

runner = CliRunner()
TINY = ["--budget", "4", "--epochs", "1", "--space", SMALL_SPACE]


def search(*args):
    return runner.invoke(app, ["search", *args])


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_tiny_search_writes_run_folder_and_front(tmp_path):
    run = tmp_path / "run"
    result = search("--budget", "4", "--epochs", "1", "--seed", "3", "--run-dir", str(run), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stdout holds the JSON document and nothing else
    assert doc["run_dir"] == str(run)
    assert doc["timings"]["trials"] == 4

    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["space"] == "ee-mbv2" and config["device"] == "edge-quad" and config["seed"] == 3
    assert config["resolved"]["dataset"]["input_shape"] == [1, 8, 8]

    trials = read_csv(run / "trials.csv")
    assert len(trials) == 4
    assert list(trials[0])[:8] == ["trial", "arch", "accuracy", "latency_ms", "energy_mj", "edp", "params", "macs"]
    for t in trials:
        json.loads(t["arch"])
        rates = [float(v) for k, v in t.items() if k.startswith("exit_rate_")]
        assert abs(sum(rates) - 1) < 1e-6
        assert 0 <= float(t["accuracy"]) <= 100
        assert float(t["edp"]) == pytest.approx(float(t["latency_ms"]) * float(t["energy_mj"]), rel=1e-4)

    front = read_csv(run / "pareto.csv")
    assert front and len(front) == len(doc["front"])
    F = minimisation_matrix([{k: float(r[k]) for k in ("accuracy", "edp")} for r in front], ["accuracy", "edp"])
    assert pareto_mask(F).all()
    # every trial off the front is dominated by a front point
    front_archs = {r["arch"] for r in front}
    all_F = minimisation_matrix([{k: float(r[k]) for k in ("accuracy", "edp")} for r in trials], ["accuracy", "edp"])
    on_front = pareto_mask(all_F)
    assert {t["arch"] for t, m in zip(trials, on_front) if m} == front_archs


def test_same_seed_same_trials(tmp_path):
    runs = []
    for name in ("a", "b"):
        result = search(*TINY, "--seed", "7", "--run-dir", str(tmp_path / name))
        assert result.exit_code == 0, result.output
        rows = read_csv(tmp_path / name / "trials.csv")
        runs.append([{k: v for k, v in r.items() if k != "train_s"} for r in rows])
    assert runs[0] == runs[1]


def test_a_cost_bound_no_candidate_meets_is_refused_before_training(tmp_path, monkeypatch):
    from nasctl.evaluation import train

    trained = []
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: trained.append(a))
    run = tmp_path / "run"
    result = search(*TINY, "--max-latency-ms", "1e-9", "--run-dir", str(run))
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith("error: no candidate of space ") and "meets latency_ms <= 1e-09" in line
    assert "the cheapest of " in line and "\n" not in line
    assert not trained and not run.exists()


def test_a_cost_bound_only_rare_candidates_meet_is_searched(tmp_path):
    """The check looks beyond its samples (knob by knob): a bound the smallest candidates
    meet starts the search."""
    from nasctl.config import make_config
    from nasctl.engine import Evaluator

    cfg = make_config({}, space=SMALL_SPACE, epochs=1, budget=4, seed=3)
    evaluator = Evaluator(cfg)
    rng = np.random.default_rng(0)
    priced = [evaluator.price(a, 0.0, [1.0] + [0.0] * (len(evaluator.space.active_exits(a)) - 1))["latency_ms"]
              for a in (evaluator.space.sample(rng) for _ in range(300))]
    bound = min(priced)  # the cheapest of 300 samples
    bounded = Evaluator(cfg.model_copy(update={"max_latency_ms": bound}))
    with pytest.raises(UsageError, match="relax the bound"):
        bounded.check_costs_reachable(samples=1, max_prices=1)  # one sample alone does not meet it ...
    bounded.check_costs_reachable(samples=1)  # ... knob by knob from it, one does
    with pytest.raises(UsageError, match="relax the bound"):
        Evaluator(cfg.model_copy(update={"max_latency_ms": bound / 1000})).check_costs_reachable()


def test_constraint_shapes_the_front(tmp_path):
    run = tmp_path / "run"
    result = search(*TINY, "--max-params", "6000", "--run-dir", str(run), "--json")
    if result.exit_code == 0:
        front = json.loads(result.stdout)["front"]
        assert all(r["params"] <= 6000 for r in front)
    trials = read_csv(run / "trials.csv")
    assert all((t["feasible"] == "true") == (int(t["params"]) <= 6000) for t in trials)


def test_existing_run_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    assert search(*TINY, "--run-dir", str(run)).exit_code == 0
    result = search(*TINY, "--run-dir", str(run))
    assert result.exit_code == 2 and "already holds a run" in result.stderr


def test_ctrl_c_keeps_finished_trials(tmp_path, monkeypatch):
    from nasctl.evaluation import train

    real = train.evaluate
    calls = []

    def stop_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "evaluate", stop_on_third)
    run = tmp_path / "run"
    result = search(*TINY, "--run-dir", str(run))
    assert result.exit_code == 130
    assert result.stderr.startswith("error: interrupted after 2 of 4 trials; they are kept in")
    assert len(read_csv(run / "trials.csv")) == 2
    assert len(read_csv(run / "pareto.csv")) >= 1
