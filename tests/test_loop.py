"""The one search loop (nasctl.loop): failed and unpriceable candidates, screening, and the
engine driving it (failed trainings, worker caps)."""

import csv
import json

import pytest
from typer.testing import CliRunner

from nasctl.cli import app
from nasctl.loop import MemoryTrials, Unpriced, search_loop, summarise_failures
from nasctl.spaces.loader import load_space
from nasctl.strategies import STRATEGIES
from nasctl.surrogate import Surrogate

runner = CliRunner()
POOL = "avg_pool_3x3"


def synthetic(space):
    """evaluate/price functions over NB201 cells: accuracy rises with 3x3 convs, cost with
    every conv; cells whose first edge is an average pooling have no cost (a hole)."""
    calls = {"evaluated": 0, "unpriced": 0}

    def price(arch, accuracy, rates):
        if arch["edge_1_0"] == POOL:
            raise Unpriced(f"no cost for {json.dumps(arch)}")
        ops = list(arch.values())
        return {"arch": json.dumps(arch, sort_keys=True), "accuracy": accuracy, "feasible": True,
                "latency_ms": 1 + 0.4 * ops.count("nor_conv_3x3") + 0.1 * ops.count("nor_conv_1x1")}

    def evaluate(arch):
        try:
            row = price(arch, 0.0, [1.0])
        except Unpriced:
            calls["unpriced"] += 1
            raise
        calls["evaluated"] += 1
        ops = list(arch.values())
        row["accuracy"] = 80 + 2.5 * ops.count("nor_conv_3x3") + ops.count("nor_conv_1x1") - ops.count("none")
        return row

    return evaluate, price, calls


def run(name, budget, seed=0, surrogate=None, screen=5):
    space = load_space("nb201")
    strategy = STRATEGIES.get(name)()
    strategy.setup(space, 2, 0, seed=seed, budget=budget * (screen if surrogate else 1), pool=bool(surrogate))
    evaluate, price, calls = synthetic(space)
    trials = MemoryTrials()
    sur = Surrogate(surrogate, space, seed=seed, budget=budget) if surrogate else None
    search_loop(space, strategy, trials, evaluate, price, objectives=["accuracy", "latency_ms"], constraints=[],
                budget=budget, surrogate=sur, screen=screen)
    return trials, calls


def test_unpriceable_candidates_fail_without_using_the_budget():
    trials, calls = run("random", 60)
    rows = trials.finished_rows()
    assert len(rows) == 60 and calls["evaluated"] == 60
    assert calls["unpriced"] == len(trials.failures()) > 0  # random proposes holes (a fifth of the space)
    assert all(json.loads(r["arch"])["edge_1_0"] != POOL for r in rows)
    assert summarise_failures(trials.failures()).startswith(f"{calls['unpriced']} trial(s) failed: cannot be priced")


def test_screening_never_evaluates_a_candidate_it_cannot_price():
    # 600 proposals per real evaluation: about 120 of each 600 are holes
    trials, calls = run("random", 40, surrogate="ridge", screen=600)
    warmup = 10
    assert len(trials.finished_rows()) == 40
    assert calls["unpriced"] <= warmup  # only warm-up proposals (unscreened) may be holes


@pytest.mark.parametrize("name", ["nsga2", "tpe", "rl"])
def test_strategies_learn_not_to_propose_candidates_like_those_that_failed(name):
    """Told the worst values for unpriceable candidates, a learning strategy proposes fewer
    of them than random search (which proposes one in five) over the same budget."""
    _, random_calls = run("random", 150)
    _, calls = run(name, 150)
    assert calls["unpriced"] < 0.75 * random_calls["unpriced"]


def test_a_candidate_that_cannot_be_trained_is_a_failed_trial_and_the_search_goes_on(tmp_path, monkeypatch):
    import nasctl.evaluation.train as train

    real = train.evaluate

    def evaluate(space, arch, *args, **kwargs):
        if arch["s1_channels"] == 24:  # the wider first stage "does not fit in memory"
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")
        return real(space, arch, *args, **kwargs)

    monkeypatch.setattr(train, "evaluate", evaluate)
    result = runner.invoke(app, ["search", "--budget", "8", "--epochs", "1", "--strategy", "random",
                                 "--run-dir", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["failed"] > 0
    assert any("RuntimeError: [enforce fail" in n and "not enough memory" in n for n in doc["notes"])
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        trials = list(csv.DictReader(f))
    assert len(trials) + doc["failed"] == 8  # a failed training counts against the budget
    assert trials and all(json.loads(t["arch"])["s1_channels"] != 24 for t in trials)


def test_all_candidates_failing_is_one_line_and_keeps_the_run(tmp_path, monkeypatch):
    import nasctl.evaluation.train as train

    def evaluate(*args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(train, "evaluate", evaluate)
    result = runner.invoke(app, ["search", "--budget", "3", "--epochs", "1", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert "no candidate could be evaluated: 3 trial(s) failed: RuntimeError: CUDA error" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert (tmp_path / "run" / "study.db").is_file()


def test_workers_are_capped_at_the_budget_and_threads_at_the_cores(tmp_path):
    import os

    import yaml

    result = runner.invoke(app, ["search", "--budget", "2", "--epochs", "1", "--workers", "64", "--threads", "100000",
                                 "--run-dir", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "--workers 64 capped at 2: one per trial of --budget 2" in doc["notes"]
    assert f"--threads 100000 capped at {os.cpu_count()}: this machine's cores" in doc["notes"]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["threads"] == os.cpu_count()
    assert len((tmp_path / "run" / "trials.csv").read_text().splitlines()) == 3


def test_workers_are_capped_at_what_memory_holds(monkeypatch):
    from nasctl import engine
    from nasctl.config import make_config

    monkeypatch.setattr(engine, "available_memory", lambda: 2 * 2**30)
    cap, why = engine.worker_cap(make_config(workers=16, budget=100))
    assert cap == 2**30 // engine.WORKER_BYTES == 3
    assert why.startswith("2.0 GiB of available memory holds 3")


def test_a_search_resolves_each_name_to_its_file_once(tmp_path, monkeypatch):
    from nasctl import workspace

    calls = []
    real = workspace.find

    def find(folder, name, what):
        calls.append((folder, name))
        return real(folder, name, what)

    monkeypatch.setattr(workspace, "find", find)
    result = runner.invoke(app, ["search", "--budget", "2", "--epochs", "1", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    # looked up by name once each; later reads go to the file found (a path, not a name)
    names = [c for c in calls if c[0] in ("search_spaces", "hardware") and isinstance(c[1], str)]
    assert sorted(names) == [("hardware", "edge-quad"), ("search_spaces", "ee-mbv2")]
