"""Ridge regression: the floor every other model must beat.

The penalty is chosen from a log-spaced grid by efficient leave-one-out error
(scikit-learn's `RidgeCV`); the fitted weights are kept as plain arrays, so predicting
and saving need numpy only."""

from __future__ import annotations

import numpy as np

from .base import Predictor


class RidgePredictor(Predictor):
    kind = "ridge"
    min_rows = 5
    defaults = {"alphas": [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]}

    def _fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        from sklearn.linear_model import RidgeCV

        model = RidgeCV(alphas=self.params["alphas"]).fit(X, Y)
        self._coef = np.asarray(model.coef_, dtype=float).reshape(Y.shape[1], X.shape[1]).T
        self._intercept = np.asarray(model.intercept_, dtype=float).reshape(Y.shape[1])
        self._alpha = float(model.alpha_)

    def _predict(self, X: np.ndarray):
        return X @ self._coef + self._intercept, None

    def _state(self) -> dict:
        return {"coef": self._coef.tolist(), "intercept": self._intercept.tolist(), "alpha": self._alpha}

    def _restore(self, state: dict, tensors) -> None:
        self._coef, self._intercept = np.array(state["coef"]), np.array(state["intercept"])
        self._alpha = state["alpha"]
