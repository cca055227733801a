"""The predictor contract: fit on architectures and measured values, predict, save, load.

A predictor maps architectures of one search space to one or more targets (test
accuracy, an exit's accuracy or exit rate, ...).  `fit(archs, y)` takes y of shape (n,)
or (n, t); `predict(archs)` answers the same shape - the mean, and the spread (a
standard deviation) where the model has one, else None.  Models fit each target on
a monotone map of it (`target_map`): `rank`, the default, the normal scores of the
training values' ranks (predictions map back by linear interpolation between the
training values, linearly extended beyond them); `standard`, z-scores.  The rank map
lets a model spend its capacity on the order of architectures rather than on a long
tail of poor ones (on NB201 it lifts Spearman by 0.03 to 0.05).  Features are an
encoding of the architecture (`encodings`), optionally followed by zero-cost proxies
computed on the untrained network (`zero_cost`).

Saved predictors are a folder: `card.yaml` (what it is, what it was trained on, how well
it did), `model.json` (scalings and, for numpy models, every weight) and, for torch
models, `weights.pt` (a `state_dict`, loaded with `weights_only=True`).  No pickles.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from .. import __version__
from ..errors import UsageError
from ..spaces.base import Arch, SearchSpace, space_fingerprint
from . import encodings

FORMAT = 1  # version of the saved layout; loading refuses newer ones
TARGET_MAPS = ("rank", "standard")
CARD, STATE, WEIGHTS = "card.yaml", "model.json", "weights.pt"


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Predictor(ABC):
    kind: str = ""                              # its name in PREDICTORS
    min_rows: int = 5                           # fewest training rows it can fit
    accepts: tuple[str, ...] = encodings.VECTOR  # encodings the model can consume
    defaults: dict[str, Any] = {}               # hyperparameters and their defaults
    has_spread: bool = False
    uses_torch: bool = False

    def __init__(self, space: SearchSpace, *, seed: int = 0, encoding: str | None = None,
                 zero_cost: Sequence[str] = (), input_shape: Sequence[int] | None = None,
                 classes: int | None = None, target_map: str = "rank", **params):
        self.space, self.seed = space, int(seed)
        preferred = encodings.default(space)
        self.encoding = encoding or (preferred if preferred in self.accepts else self.accepts[0])
        encodings.check(space, self.encoding, self.accepts, self.kind)
        if target_map not in TARGET_MAPS:
            raise UsageError(f"target map '{target_map}' is not one of: {', '.join(TARGET_MAPS)}")
        self.target_map = target_map
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise UsageError(f"model '{self.kind}' has no setting {', '.join(unknown)}; "
                             f"its settings: {', '.join(self.defaults) or 'none'}")
        self.params = {**self.defaults, **params}
        self.zero_cost = list(zero_cost)
        self.input_shape, self.classes = None, None
        if self.zero_cost:
            from .zero_cost import check_proxies, resolve_input

            check_proxies(self.zero_cost)
            self.input_shape, self.classes = resolve_input(space, input_shape, classes)
        self.targets = 0     # number of target columns; 0 until fitted
        self._multi = False  # fitted on y of shape (n, t)

    # -- public API ---------------------------------------------------------------------
    def fit(self, archs: Sequence[Arch], y) -> "Predictor":
        Y = np.asarray(y, dtype=float)
        if Y.ndim not in (1, 2) or len(Y) != len(archs):
            raise UsageError(f"targets of shape {Y.shape} do not match {len(archs)} architectures")
        if len(archs) < self.min_rows:
            raise UsageError(f"model '{self.kind}' needs at least {self.min_rows} training rows; got {len(archs)}")
        if not np.isfinite(Y).all():
            raise UsageError("training targets hold empty or non-numeric values")
        self._multi = Y.ndim == 2
        Y = Y.reshape(len(Y), -1)
        self.targets = Y.shape[1]
        self._map = TargetMap.fit(self.target_map, Y)
        extra = self._proxies(archs)
        if extra is not None:
            self._zc_mean = extra.mean(axis=0)
            scale = extra.std(axis=0)
            self._zc_scale = np.where(scale > 0, scale, 1.0)
        self._fit(self._inputs(archs, extra), self._map.forward(Y))
        return self

    def predict(self, archs: Sequence[Arch], optimism: float | Sequence[float] = 0.0
                ) -> tuple[np.ndarray, np.ndarray | None]:
        """The mean and spread of each target.  With `optimism` (one number, or one per
        target), the first is the prediction that many spreads above the mean on the
        model's scale, mapped back: an upper quantile where the model has a spread, the
        mean where it has none."""
        if not self.targets:
            raise UsageError(f"predictor '{self.kind}' has not been fitted")
        if not len(archs):
            empty = np.zeros((0, self.targets) if self._multi else 0)
            return empty, (empty.copy() if self.has_spread else None)
        z, spread = self._predict(self._inputs(archs, self._proxies(archs)))
        mean = self._map.inverse(z if spread is None else z + np.asarray(optimism, dtype=float) * spread)
        std = None if spread is None else (self._map.inverse(z + spread) - self._map.inverse(z - spread)) / 2
        if not self._multi:
            mean = mean[:, 0]
            std = None if std is None else std[:, 0]
        return mean, std

    def card(self) -> dict:
        """What the predictor is: written into card.yaml (training data and metrics are added by the caller)."""
        return {"format": FORMAT, "model": self.kind, "space": self.space.name,
                "space_fingerprint": space_fingerprint(self.space), "encoding": self.encoding,
                "zero_cost": self.zero_cost,
                "input_shape": None if self.input_shape is None else list(self.input_shape),
                "classes": self.classes, "target_map": self.target_map, "params": self.params, "seed": self.seed,
                "targets": self.targets, "spread": self.has_spread}

    def save(self, folder: Path, card_extra: dict | None = None) -> Path:
        """Write the predictor into `folder` (created); returns the card's path."""
        if not self.targets:
            raise UsageError(f"predictor '{self.kind}' has not been fitted; nothing to save")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {"multi": self._multi, "target_map": self._map.knots, "model": self._state()}
        if self.zero_cost:
            state["zc_mean"], state["zc_scale"] = self._zc_mean.tolist(), self._zc_scale.tolist()
        (folder / STATE).write_text(json.dumps(state), encoding="utf-8")
        files = [STATE]
        if self.uses_torch:
            import torch

            torch.save(self._tensors(), folder / WEIGHTS)  # torch models define _tensors
            files.append(WEIGHTS)
        card = {**self.card(), **(card_extra or {}),
                "files": {f: file_hash(folder / f) for f in files},
                "versions": _versions(self.uses_torch),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        path = folder / CARD
        path.write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
        return path

    def restore(self, state: dict, folder: Path) -> None:
        """Set the fitted state from what `save` wrote into `folder`."""
        self._multi = bool(state["multi"])
        self._map = TargetMap(self.target_map, state["target_map"])
        self.targets = len(self._map.knots)
        if self.zero_cost:
            self._zc_mean, self._zc_scale = np.array(state["zc_mean"]), np.array(state["zc_scale"])
        tensors = None
        if self.uses_torch:
            import torch

            tensors = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
        self._restore(state["model"], tensors)

    # -- features -----------------------------------------------------------------------
    def _proxies(self, archs: Sequence[Arch]) -> np.ndarray | None:
        """Zero-cost proxy scores of `archs` (n × proxies), or None without proxies."""
        if not self.zero_cost:
            return None
        from .zero_cost import scores

        return scores(self.space, archs, self.zero_cost, self.input_shape, self.classes, self.seed)

    def _inputs(self, archs: Sequence[Arch], proxies: np.ndarray | None):
        """What `_fit` and `_predict` consume: the encoding, then the standardised proxies."""
        X = encodings.encode(self.space, archs, self.encoding)
        if proxies is None:
            return X
        return np.hstack([X, (proxies - self._zc_mean) / self._zc_scale])

    # -- what a model implements ----------------------------------------------------------
    @abstractmethod
    def _fit(self, X, Y: np.ndarray) -> None:
        """Fit mapped targets Y (n × t) from the inputs of `_inputs`."""

    @abstractmethod
    def _predict(self, X) -> tuple[np.ndarray, np.ndarray | None]:
        """Mean (n × t) and spread (n × t, or None) on the mapped scale."""

    @abstractmethod
    def _state(self) -> dict:
        """JSON-serialisable fitted state (numpy models: every weight)."""

    @abstractmethod
    def _restore(self, state: dict, tensors: dict | None) -> None:
        """Inverse of `_state` (and of `_tensors` for torch models)."""


class TargetMap:
    """Per-target monotone map between measured values and the scale models fit.

    Per target column, `knots` holds the points (value, mapped) it interpolates between
    and the slope (value per mapped unit: the training values' standard deviation) it
    extends with beyond them: for `rank`, every distinct training value and the mean
    normal score of its ranks; for `standard`, (mean - sd, -1) and (mean + sd, 1).
    Beyond the training range predictions keep their order: a candidate predicted
    better than every training architecture is predicted above the best of them."""

    def __init__(self, kind: str, knots: list):
        self.kind, self.knots = kind, knots
        self._arrays = [(np.array(v, dtype=float), np.array(z, dtype=float), float(slope)) for v, z, slope in knots]

    @classmethod
    def fit(cls, kind: str, Y: np.ndarray) -> "TargetMap":
        from scipy.stats import norm, rankdata

        knots = []
        for y in Y.T:
            sd = float(y.std()) or 1.0
            if kind == "rank":
                z = norm.ppf((rankdata(y) - 0.5) / len(y))
                values, which = np.unique(y, return_inverse=True)
                mapped = np.bincount(which, weights=z) / np.bincount(which)
            else:
                values, mapped = np.array([y.mean() - sd, y.mean() + sd]), np.array([-1.0, 1.0])
            knots.append([values.tolist(), mapped.tolist(), sd])
        return cls(kind, knots)

    def forward(self, Y: np.ndarray) -> np.ndarray:
        return np.column_stack([_piecewise(y, v, z, 1 / slope) for y, (v, z, slope) in zip(Y.T, self._arrays)])

    def inverse(self, Z: np.ndarray) -> np.ndarray:
        return np.column_stack([_piecewise(z, zs, v, slope) for z, (v, zs, slope) in zip(Z.T, self._arrays)])


def _piecewise(x: np.ndarray, src: np.ndarray, dst: np.ndarray, slope: float) -> np.ndarray:
    """Linear interpolation through the points (src, dst), extended with `slope` beyond them."""
    inside = np.interp(x, src, dst)
    return np.where(x < src[0], dst[0] + (x - src[0]) * slope,
                    np.where(x > src[-1], dst[-1] + (x - src[-1]) * slope, inside))


def _versions(with_torch: bool) -> dict:
    import scipy
    import sklearn

    out = {"nasctl": __version__, "python": platform.python_version(), "numpy": np.__version__,
           "scipy": scipy.__version__, "scikit-learn": sklearn.__version__}
    if with_torch:
        import torch

        out["torch"] = str(torch.__version__)
    return out
