"""Fitting a new device from a few measured models, with devices already known as a prior
(`nasctl hw fit --device NEW --models FILE --prior DEV1,DEV2`).

A prior device is any device nasctl can load whose `estimate(layers)` prices the models'
layer lists: a `lut` device (profiled or fitted), an analytical or `gpu` one, or a
plugin's kind.  Each prior prices every distinct kernel of the measured models (and of
the prior tables), and the new device's cost of a kernel is modelled as

    cost(kernel) = Σ_k w_k · cost_k(kernel) + correction(kernel),    w_k ≥ 0,

plus a per-model overhead of its own: a non-negative combination of the prior devices'
kernel costs plus a non-negative correction in one of `fit.py`'s kernel groupings
(`kernels`, `types`, `types-shared`; per kernel type a cost per unit of work and per
layer), solved by least squares on relative errors.  The correction is held back by a
ridge penalty on its (scale-free) coefficients.  How much to trust the prior is chosen by
cross-validation on the measured models alone (at least 3 distinct ones; leave one model out
up to 20, 10 folds above; rows of the same layers are held out together), among

  prior             the combination and an overhead only (no correction): a handful of
                    models determine it;
  prior+G@λ         the combination plus a correction in grouping G, penalty λ (TRUSTS);
  none+G            no prior: `fit_from_models` with grouping G, where the models are
                    enough to fit it from scratch (`feasible_groupings`); where it wins,
                    the result is `fit_from_models` itself, the grouping its own choice
                    (`hw fit --models` exactly).

The least CV error wins, except that a prior is trusted over a fit from scratch only where
it at least halves the best `none` candidate's CV error (MARGIN): with a dozen prior
candidates against one to three without, the least of theirs is the luckier draw, and
on a few models a narrow win does not price unmeasured ones better.  A prior that does
not help a device loses to `none`.  The result
is a normal `kind: lut` device (`fit.write_device`): its table holds every distinct
kernel of the measured models and of the `lut` priors' tables (where every prior prices
it), each at its fitted cost, and its `fit.prior` records the prior devices, their
weights, the trust chosen and every candidate's CV error.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import UsageError
from .base import CostModel
from .fit import (FLOOR_MS, GROUPINGS, FittedDevice, _choose_regressors, _Grouping, _spec, checked_latencies,
                  cv_rms_error, distinct_layers, feasible_groupings, fit_from_models, model_groups)
from .layers import LayerSpec
from .lut import LutDevice, layer_from_row, read_lut, row_from_layer

TRUSTS = (1.0, 0.1, 0.01, 0.001)  # ridge penalties of the correction tried, strongest first
MIN_MODELS = 3  # fewest measured models a prior fit cross-validates
MARGIN = 2.0  # the prior is kept over a fit from scratch only where it divides its CV error by this (or more)


def prior_costs(device: CostModel, kernels: Sequence[LayerSpec], strict: bool = True) -> np.ndarray:
    """Each kernel's latency (ms) on a prior device, its per-model overhead left out; NaN
    where it cannot price one.  With `strict`, a kernel it cannot price is a UsageError
    naming the device."""
    if not kernels:
        return np.zeros(0)
    try:  # the first layer of a list carries a table device's per-model overhead: price the first kernel twice
        report = device.estimate([kernels[0], *kernels])
        costs = np.array([float(c.latency_ms) for c in report.costs[1:]])
        bad = np.array([c.mapping == "unsupported" for c in report.costs[1:]]) | ~np.isfinite(costs) | (costs < 0)
    except Exception as e:  # a device of any kind: its failure is the user's prior choice, reported in one line
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        raise UsageError(f"prior device '{device.name}' cannot price the models' kernels ({reason}); a prior "
                         f"must be a device whose estimate prices every layer of the measured models") from None
    if strict and bad.any():
        ops = ", ".join(sorted({kernels[i].op for i in np.flatnonzero(bad)}))
        raise UsageError(f"prior device '{device.name}' cannot price the models' kernels (ops: {ops}); a prior "
                         f"must be a device whose estimate prices every layer of the measured models")
    costs[bad] = np.nan
    return costs


def _table_kernels(devices: Sequence[CostModel]) -> list[LayerSpec]:
    """The kernels of the prior devices that are tables (`lut` devices read from a file)."""
    return [layer_from_row(r) for d in devices if isinstance(d, LutDevice) and d.source is not None
            for r in read_lut(d.source)]


class _Candidate:
    """One way of trusting the prior: design-matrix columns (prior combination, correction,
    overhead) and the ridge penalty on the correction columns."""

    def __init__(self, label: str, prior: np.ndarray, correction: np.ndarray, penalty: float,
                 grouping: Optional[_Grouping]):
        self.label, self.grouping, self.penalty = label, grouping, penalty
        self.n_prior, self.n_corr = prior.shape[1], correction.shape[1]
        self.A = np.column_stack([prior, correction, np.ones(len(prior))])

    def solve(self, A: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Non-negative least squares on relative errors, columns scaled to unit RMS, the
        correction's scaled coefficients penalised by `penalty` per model."""
        from scipy.optimize import nnls

        Z = A / y[:, None]
        rms = np.sqrt(np.mean(Z ** 2, axis=0))
        rms[rms == 0] = 1.0
        Z = Z / rms
        target = np.ones(len(y))
        if self.n_corr and self.penalty > 0:
            rows = np.zeros((self.n_corr, Z.shape[1]))
            rows[:, self.n_prior:self.n_prior + self.n_corr] = np.sqrt(self.penalty * len(y)) * np.eye(self.n_corr)
            Z, target = np.vstack([Z, rows]), np.r_[target, np.zeros(self.n_corr)]
        z, _ = nnls(Z, target, maxiter=50 * Z.shape[1])
        return z / rms


def fit_with_prior(name: str, layer_lists: Sequence[Sequence[LayerSpec]], latency_ms: Sequence[float],
                   priors: Sequence[CostModel], grouping: Optional[str] = None,
                   description: str = "") -> FittedDevice:
    """A device fitted to the measured latencies with `priors` (loaded devices) as a prior;
    see the module docstring.  `grouping` restricts the correction and the no-prior fit to
    one of GROUPINGS."""
    y = checked_latencies(layer_lists, latency_ms)
    if not priors:
        raise UsageError("a prior needs at least one device")
    groups = model_groups(layer_lists)  # rows of the same layers: one model, held out together
    distinct = len(np.unique(groups))
    if distinct < MIN_MODELS:
        raise UsageError(f"{distinct} measured models are too few to fit with a prior: it needs at least {MIN_MODELS} "
                         f"distinct ones (the trust in it is chosen by cross-validation on them)"
                         + (f"; {len(y)} rows, some of the same model" if distinct < len(y) else ""))
    if grouping is not None and grouping not in GROUPINGS:
        raise UsageError(f"unknown grouping '{grouping}'; allowed: {', '.join(GROUPINGS)}")
    groupings = [grouping] if grouping else list(GROUPINGS)
    kernels = distinct_layers(layer_lists)
    index = {k.shape_key(): i for i, k in enumerate(kernels)}
    counts = np.zeros((len(y), len(kernels)))
    for m, layers in enumerate(layer_lists):
        for layer in layers:
            counts[m, index[layer.shape_key()]] += 1
    costs = np.column_stack([prior_costs(d, kernels) for d in priors])  # kernel x prior
    features = counts @ costs

    candidates = [_Candidate("prior", features, np.zeros((len(y), 0)), 0.0, None)]
    without = []  # no prior, where the models are enough to fit from scratch: tried last
    scratch = feasible_groupings(layer_lists, len(y))
    for g in groupings:
        grp = _Grouping.make(g, layer_lists)
        G = np.array([grp.columns(layers) for layers in layer_lists])[:, :-1]  # intercept left to the candidate
        candidates += [_Candidate(f"prior+{g}@{lam:g}", features, G, lam, grp) for lam in TRUSTS]
        if g in scratch:
            without.append(_Candidate(f"none+{g}", np.zeros((len(y), 0)), G, 0.0, grp))
    candidates += without
    folds = distinct if distinct <= 20 else 10  # over distinct models: a model's twin rows are held out together
    errors = {c.label: round(cv_rms_error(c.A, y, c.solve, folds=folds, groups=groups), 3) for c in candidates}
    best = min(candidates[:len(candidates) - len(without)], key=lambda c: errors[c.label])
    scratch_best = min(without, key=lambda c: errors[c.label], default=None)
    if scratch_best is not None and errors[scratch_best.label] < MARGIN * errors[best.label]:
        best = scratch_best  # the prior must at least halve the error of fitting without it
    names = [d.name for d in priors]
    record = {"devices": names, "trust": best.label,
              "cv": "leave one model out" if folds == distinct else f"{folds}-fold", "cv_rms_error_pct": errors}

    if best.label.startswith("none+"):  # the prior does not help: today's fit (its own grouping), with the record of why
        fitted = fit_from_models(name, layer_lists, y, grouping=grouping, description=description)
        record["trust"] = f"none+{fitted.spec['fit']['grouping']}"
        fitted.spec["fit"]["prior"] = {**record, "weights": {n: 0.0 for n in names}}
        return fitted

    x = best.solve(best.A, y)
    w, corr, per_model = x[:best.n_prior], x[best.n_prior:-1], float(x[-1])
    grp = best.grouping
    coef = np.r_[corr, 0.0] if grp is not None else np.zeros(1)
    per_layer = float(coef[grp.keys.index("layer")]) if grp is not None and "layer" in grp.keys else 0.0

    extra = [k for k in distinct_layers([_table_kernels(priors)]) if k.shape_key() not in index]
    extra_costs = np.column_stack([prior_costs(d, extra, strict=False) for d in priors]) if extra else \
        np.zeros((0, len(priors)))
    keep = np.all(np.isfinite(extra_costs), axis=1)
    table = kernels + [k for k, ok in zip(extra, keep) if ok]
    mixed = np.r_[costs @ w, extra_costs[keep] @ w]
    rows = [row_from_layer(k, max(c + (grp.layer_cost(k, coef) if grp is not None else 0.0), FLOOR_MS))
            for k, c in zip(table, mixed)]

    train = best.A @ x / y - 1.0
    fit = {"from": "end-to-end latencies with a prior", "models": len(y),
           "prior": {**record, "weights": {n: round(float(v), 6) for n, v in zip(names, w)},
                     **({"grouping": grp.name, "strength": best.penalty} if grp is not None else {})},
           "train_rms_error_pct": round(float(np.sqrt(np.mean(train ** 2)) * 100), 2),
           "kernels": {"measured": len(kernels), "from_prior_tables": len(rows) - len(kernels)}}
    spec = _spec(name, description or f"fitted from {len(y)} end-to-end latencies with {', '.join(names)} as a "
                 f"prior ({best.label})", per_model_ms=per_model, per_layer_ms=per_layer, fit=fit)
    fitted = FittedDevice(name, spec, rows, fit)
    _choose_regressors(fitted)
    return fitted
