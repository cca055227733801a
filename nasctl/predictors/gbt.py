"""Gradient-boosted regression trees.

Fitted with scikit-learn's `GradientBoostingRegressor` (one ensemble per target), then
every tree is kept as plain arrays - children, split feature, threshold, leaf value -
and predicted with numpy (`nasctl.trees`): the saved model is JSON and needs no
scikit-learn to load."""

from __future__ import annotations

import numpy as np

from .. import trees
from .base import Predictor


class GBTPredictor(Predictor):
    kind = "gbt"
    min_rows = 10
    defaults = {"trees": 400, "learning_rate": 0.05, "max_depth": 4, "subsample": 0.8, "min_samples_leaf": 3}

    def _fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        from sklearn.ensemble import GradientBoostingRegressor

        p = self.params
        self._ensembles = [trees.export(GradientBoostingRegressor(
            n_estimators=p["trees"], learning_rate=p["learning_rate"], max_depth=p["max_depth"],
            subsample=p["subsample"], min_samples_leaf=p["min_samples_leaf"],
            random_state=self.seed + t).fit(X, Y[:, t])) for t in range(Y.shape[1])]
        self._compiled = [trees.Ensemble(e) for e in self._ensembles]

    def _predict(self, X: np.ndarray):
        return np.column_stack([e.predict(X) for e in self._compiled]), None

    def _state(self) -> dict:
        return {"ensembles": self._ensembles}

    def _restore(self, state: dict, tensors) -> None:
        self._ensembles = state["ensembles"]
        self._compiled = [trees.Ensemble(e) for e in self._ensembles]
