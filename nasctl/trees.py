"""Gradient-boosted regression trees kept as plain arrays and predicted with numpy.

`export` turns a fitted scikit-learn `GradientBoostingRegressor` into JSON-ready data -
its initial value, learning rate and every tree's children, split features, thresholds
and leaf values - and `Ensemble` predicts from that data without scikit-learn: saved
models are JSON, never pickles, and load in milliseconds."""

from __future__ import annotations

import numpy as np

_FIELDS = ("left", "right", "feature", "threshold", "value")


def export(model) -> dict:
    """The data of a fitted GradientBoostingRegressor (one output)."""
    trees = [{"left": e.tree_.children_left.tolist(), "right": e.tree_.children_right.tolist(),
              "feature": e.tree_.feature.tolist(), "threshold": e.tree_.threshold.tolist(),
              "value": e.tree_.value[:, 0, 0].tolist()} for e in model.estimators_[:, 0]]
    return {"init": float(np.ravel(model.init_.constant_)[0]), "learning_rate": float(model.learning_rate),
            "trees": trees}


class Ensemble:
    """Predictions of exported trees: init + learning rate x the sum of the leaf values."""

    def __init__(self, data: dict):
        self.init, self.rate = data["init"], data["learning_rate"]
        self.trees = [tuple(np.array(tree[f]) for f in _FIELDS) for tree in data["trees"]]

    def predict(self, X: np.ndarray) -> np.ndarray:
        X32 = np.asarray(X).astype(np.float32)  # scikit-learn's trees split float32 features
        return self.init + self.rate * sum(_walk(tree, X32) for tree in self.trees)


def _walk(tree, X: np.ndarray) -> np.ndarray:
    """Leaf value each row of X reaches (a feature <= threshold goes left, as in scikit-learn)."""
    left, right, feature, threshold, value = tree
    node = np.zeros(len(X), dtype=np.int64)
    rows = np.arange(len(X))
    while True:
        inner = left[node] >= 0
        if not inner.any():
            return value[node]
        r, n = rows[inner], node[inner]
        node[r] = np.where(X[r, feature[n]] <= threshold[n], left[n], right[n])
