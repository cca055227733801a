"""The optuna study of a run: it names its objectives (optuna-dashboard labels its plots with
them), and workers sharing it keep to the budget."""

import warnings

import optuna

from nasctl.spaces.loader import load_space
from nasctl.store import TrialStore


def test_the_study_is_created_with_the_objectives_as_metric_names(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with warnings.catch_warnings():
        # set_metric_names is experimental in optuna: its warning is not shown to the user
        warnings.simplefilter("error", optuna.exceptions.ExperimentalWarning)
        TrialStore(url, "run", ["maximize", "minimize"], load_space("nb201"), objectives=["accuracy", "edp"])
    assert optuna.load_study(study_name="run", storage=url).metric_names == ["accuracy", "edp"]


def test_names_already_set_are_kept(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=url, study_name="run", directions=["maximize", "minimize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.set_metric_names(["top-1", "energy-delay"])
    TrialStore(url, "run", ["maximize", "minimize"], load_space("nb201"), objectives=["accuracy", "edp"])
    assert optuna.load_study(study_name="run", storage=url).metric_names == ["top-1", "energy-delay"]


def test_of_two_workers_that_each_saw_the_last_trial_of_the_budget_only_the_first_runs_it(tmp_path):
    import numpy as np

    from nasctl.spaces.base import arch_key

    url, space = f"sqlite:///{tmp_path / 'study.db'}", load_space("nb201")
    a, b = TrialStore(url, "run", ["maximize"], space), TrialStore(url, "run", ["maximize"], space)
    rng = np.random.default_rng(0)
    first, second, third, fourth = (space.sample(rng) for _ in range(4))
    done = a.start(first, arch_key(first), budget=2)
    a.finish(done, {"arch": arch_key(first)}, [0.5], {})
    assert a.n_claimed() == b.n_claimed() == 1  # both workers see one trial left and open one
    kept = a.start(second, arch_key(second), budget=2)
    assert kept is not None
    assert b.start(third, arch_key(third), budget=2) is None
    assert b.n_claimed() == 2  # the refused trial does not count against the budget
    a.fail(kept, "RuntimeError: out of memory", counts=False)  # failed before training: the slot is free again
    assert b.start(fourth, arch_key(fourth), budget=2) is not None
