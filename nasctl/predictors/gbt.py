"""Gradient-boosted regression trees.

Fitted with scikit-learn's `GradientBoostingRegressor` (one ensemble per target), then
every tree is kept as plain arrays - children, split feature, threshold, leaf value -
and predicted with numpy: the saved model is JSON and needs no scikit-learn to load."""

from __future__ import annotations

import numpy as np

from .base import Predictor

_FIELDS = ("left", "right", "feature", "threshold", "value")


class GBTPredictor(Predictor):
    kind = "gbt"
    min_rows = 10
    defaults = {"trees": 400, "learning_rate": 0.05, "max_depth": 4, "subsample": 0.8, "min_samples_leaf": 3}

    def _fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        from sklearn.ensemble import GradientBoostingRegressor

        p = self.params
        self._ensembles = []
        for t in range(Y.shape[1]):
            model = GradientBoostingRegressor(
                n_estimators=p["trees"], learning_rate=p["learning_rate"], max_depth=p["max_depth"],
                subsample=p["subsample"], min_samples_leaf=p["min_samples_leaf"],
                random_state=self.seed + t).fit(X, Y[:, t])
            trees = [{"left": e.tree_.children_left.tolist(), "right": e.tree_.children_right.tolist(),
                      "feature": e.tree_.feature.tolist(), "threshold": e.tree_.threshold.tolist(),
                      "value": e.tree_.value[:, 0, 0].tolist()} for e in model.estimators_[:, 0]]
            self._ensembles.append({"init": float(np.ravel(model.init_.constant_)[0]),
                                    "learning_rate": float(p["learning_rate"]), "trees": trees})
        self._arrays()

    def _arrays(self) -> None:
        self._compiled = [(e["init"], e["learning_rate"],
                           [tuple(np.array(tree[f]) for f in _FIELDS) for tree in e["trees"]])
                          for e in self._ensembles]

    def _predict(self, X: np.ndarray):
        X32 = X.astype(np.float32)  # scikit-learn's trees split float32 features
        return np.column_stack([init + rate * sum(_walk(tree, X32) for tree in trees)
                                for init, rate, trees in self._compiled]), None

    def _state(self) -> dict:
        return {"ensembles": self._ensembles}

    def _restore(self, state: dict, tensors) -> None:
        self._ensembles = state["ensembles"]
        self._arrays()


def _walk(tree, X: np.ndarray) -> np.ndarray:
    """Leaf value each row of X reaches (a feature ≤ threshold goes left, as in scikit-learn)."""
    left, right, feature, threshold, value = tree
    node = np.zeros(len(X), dtype=np.int64)
    rows = np.arange(len(X))
    while True:
        inner = left[node] >= 0
        if not inner.any():
            return value[node]
        r, n = rows[inner], node[inner]
        node[r] = np.where(X[r, feature[n]] <= threshold[n], left[n], right[n])
