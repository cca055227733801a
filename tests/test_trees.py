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
