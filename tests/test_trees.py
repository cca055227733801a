import json

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor

from nasctl import trees


def test_exported_trees_predict_as_scikit_learn_does_after_a_json_round_trip():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    y = X[:, 0] ** 2 + np.sin(X[:, 1]) + rng.normal(scale=0.1, size=300)
    model = GradientBoostingRegressor(loss="absolute_error", n_estimators=120, max_depth=5, random_state=0).fit(X, y)
    ensemble = trees.Ensemble(json.loads(json.dumps(trees.export(model))))
    test = rng.normal(size=(400, 6))
    np.testing.assert_allclose(ensemble.predict(test), model.predict(test), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ensemble.predict(test[:1]), model.predict(test[:1]), rtol=0, atol=1e-12)


def test_fit_lad_grows_the_trees_scikit_learn_grows_split_for_split():
    """A device's boosted regressors are fitted by `fit_lad`, not scikit-learn's ensemble:
    the same trees (children, features, thresholds, leaf values) and initial value, on
    rows with repeated values and ties among features (a column copied, one constant),
    odd and even leaf sizes, several seeds."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(257, 5))
    X = np.column_stack([X, X[:, 0], np.zeros(len(X)), np.round(X[:, 1])])  # tied and constant features
    y = np.round(X[:, 0] ** 2 + np.abs(X[:, 2]) + rng.normal(scale=0.2, size=len(X)), 1)  # repeated values
    for seed in (0, 3):
        ours = trees.fit_lad(X, y, n_estimators=40, learning_rate=0.1, max_depth=5, min_samples_leaf=3, seed=seed)
        theirs = trees.export(GradientBoostingRegressor(loss="absolute_error", n_estimators=40, learning_rate=0.1,
                                                        max_depth=5, min_samples_leaf=3, random_state=seed).fit(X, y))
        assert ours == theirs


def test_packed_trees_predict_exactly_as_the_trees_they_pack_after_a_json_round_trip():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 4))
    y = X[:, 0] - X[:, 1] ** 2 + rng.normal(scale=0.1, size=200)
    data = trees.average([trees.fit_lad(X, y, n_estimators=30, learning_rate=0.1, max_depth=4, min_samples_leaf=3,
                                        seed=seed) for seed in (0, 1)])
    packed = json.loads(json.dumps(trees.pack(data)))
    assert "trees" not in packed and len(packed["sizes"]) == 60
    test = rng.normal(size=(300, 4)) * 1.5
    np.testing.assert_array_equal(trees.Ensemble(packed).predict(test), trees.Ensemble(data).predict(test))


def test_an_average_of_models_predicts_their_mean():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 3))
    y = np.sin(X[:, 0]) + X[:, 2]
    models = [trees.fit_lad(X, y, n_estimators=25, learning_rate=0.1, max_depth=3, min_samples_leaf=3, seed=seed)
              for seed in range(3)]
    test = rng.normal(size=(50, 3))
    mean = np.mean([trees.Ensemble(m).predict(test) for m in models], axis=0)
    np.testing.assert_allclose(trees.Ensemble(trees.average(models)).predict(test), mean, rtol=0, atol=1e-12)
