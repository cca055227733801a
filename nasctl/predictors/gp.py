"""Gaussian-process regression with a mean and a standard deviation.

Kernel: constant × Matérn(ν = 5/2, one length scale) + white noise, hyperparameters
fitted by maximum marginal likelihood (scikit-learn, seeded restarts).  The saved model
is the kernel's log-hyperparameters and the training data as JSON; loading refits the
posterior with the optimizer off, which reproduces the predictions exactly."""

from __future__ import annotations

import warnings

import numpy as np

from .base import Predictor


class GPPredictor(Predictor):
    kind = "gp"
    min_rows = 5
    has_spread = True
    defaults = {"restarts": 2}

    @staticmethod
    def _kernel():
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        return (ConstantKernel(1.0, (1e-3, 1e3)) * Matern(1.0, (1e-2, 1e3), nu=2.5)
                + WhiteKernel(0.1, (1e-6, 10.0)))

    def _fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor

        with warnings.catch_warnings():  # a hyperparameter at its bound is a fit, not a fault
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp = GaussianProcessRegressor(self._kernel(), n_restarts_optimizer=self.params["restarts"],
                                          random_state=self.seed).fit(X, Y)
        self._posterior(X, Y, gp.kernel_.theta.tolist())

    def _posterior(self, X: np.ndarray, Y: np.ndarray, theta: list[float]) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor

        self._X, self._Y, self._theta = X, Y, theta
        kernel = self._kernel().clone_with_theta(np.array(theta))
        self._gp = GaussianProcessRegressor(kernel, optimizer=None).fit(X, Y)

    def _predict(self, X: np.ndarray):
        mean, std = self._gp.predict(X, return_std=True)
        return mean.reshape(len(X), -1), std.reshape(len(X), -1)

    def _state(self) -> dict:
        return {"theta": self._theta, "X": self._X.tolist(), "Y": self._Y.tolist()}

    def _restore(self, state: dict, tensors) -> None:
        self._posterior(np.array(state["X"]), np.array(state["Y"]), state["theta"])
