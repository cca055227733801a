"""The optuna study of a run names its objectives, so optuna-dashboard's plots say which is which."""

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
