"""Every model kind: learns a smooth target, gives a spread where it has one, and
predicts identically after save and load (small settings keep these fast)."""

import warnings

import numpy as np
import pytest

from nasctl.errors import UsageError
from nasctl.predictors import PREDICTORS, load_predictor, make_predictor
from nasctl.predictors.metrics import spearman
from nasctl.spaces.loader import load_space

SMALL = {"gbt": {"trees": 60, "encoding": "onehot"}, "gp": {"restarts": 0, "encoding": "onehot"},
         "ridge": {"encoding": "onehot"}, "mlp": {"members": 2, "epochs": 30, "hidden": 32, "encoding": "onehot"},
         "gcn": {"members": 2, "epochs": 100, "hidden": 32}}
SPREAD = {"gp", "mlp", "gcn"}


def test_every_registered_model_is_covered():
    assert sorted(SMALL) == PREDICTORS.names()


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_model_learns_saves_and_loads(kind, nb201, tmp_path, toy_data):
    archs, y = toy_data(nb201, 120, seed=1)
    p = make_predictor(kind, nb201, seed=0, **SMALL[kind]).fit(archs[:90], y[:90])
    mean, std = p.predict(archs[90:])
    assert mean.shape == (30,) and (std is not None) == (kind in SPREAD)
    if std is not None:
        assert std.shape == (30,) and (std >= 0).all()
    assert spearman(y[90:], mean) > 0.5
    p.save(tmp_path / kind, {"target": ["y"]})
    q = load_predictor(tmp_path / kind)
    mean2, std2 = q.predict(archs[90:])
    assert np.array_equal(mean, mean2) and (std is None or np.array_equal(std, std2))


@pytest.mark.parametrize("kind", ["gbt", "mlp"])
def test_model_is_seeded(kind, nb201, toy_data):
    archs, y = toy_data(nb201, 40)
    a = make_predictor(kind, nb201, seed=4, **SMALL[kind]).fit(archs, y).predict(archs)[0]
    b = make_predictor(kind, nb201, seed=4, **SMALL[kind]).fit(archs, y).predict(archs)[0]
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kind", ["gbt", "mlp"])
def test_multi_target(kind, toy_data):
    space = load_space("ee-mbv2")
    archs, Y = toy_data(space, 60, targets=2)
    mean, _ = make_predictor(kind, space, **SMALL[kind]).fit(archs, Y).predict(archs[:7])
    assert mean.shape == (7, 2)


def test_gcn_needs_a_cell_space():
    with pytest.raises(UsageError, match="model 'gcn' works on cell spaces"):
        make_predictor("gcn", load_space("ee-mbv2"))


def test_a_fresh_interpreter_loads_and_predicts_identically(nb201, toy_data, tmp_path):
    """As after re-installing the package: nothing of the saving process is left."""
    import json
    import subprocess
    import sys

    archs, y = toy_data(nb201, 40)
    expected = {}
    for kind in ("gp", "mlp"):
        p = make_predictor(kind, nb201, **SMALL[kind]).fit(archs, y)
        p.save(tmp_path / kind)
        expected[kind] = [float(v) for v in p.predict(archs)[0]]
    (tmp_path / "archs.json").write_text(json.dumps(archs))
    code = ("import json, sys; from nasctl.predictors import load_predictor; "
            "archs = json.load(open(sys.argv[1] + '/archs.json')); "
            "print(json.dumps({k: [float(v) for v in load_predictor(sys.argv[1] + '/' + k).predict(archs)[0]] "
            "for k in ('gp', 'mlp')}))")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == expected


def test_gp_fit_is_quiet_when_a_hyperparameter_ends_at_its_bound(nb201):
    # pure noise drives the kernel's scale to its lower bound: scikit-learn warns; we do not
    rng = np.random.default_rng(0)
    archs = [nb201.sample(rng) for _ in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_predictor("gp", nb201, seed=0).fit(archs, rng.standard_normal(30))


@pytest.mark.parametrize("kind", ["gp", "ridge"])
def test_optimism_is_an_upper_quantile_where_the_model_has_a_spread(kind, nb201, toy_data):
    archs, y = toy_data(nb201, 80, seed=2)
    p = make_predictor(kind, nb201, seed=0, **SMALL[kind]).fit(archs[:60], np.column_stack([y[:60], -y[:60]]))
    mean, std = p.predict(archs[60:])
    upper, _ = p.predict(archs[60:], optimism=[1.0, 0.0])
    if kind in SPREAD:
        assert (upper[:, 0] > mean[:, 0]).all() and (upper[:, 0] <= mean[:, 0] + 3 * std[:, 0]).all()
    else:
        assert np.array_equal(upper[:, 0], mean[:, 0])
    assert np.array_equal(upper[:, 1], mean[:, 1])  # no optimism asked for the second target
