"""How well predictions rank and match measured values."""

from __future__ import annotations

import numpy as np


def kendall_tau(y, pred) -> float:
    """Kendall's tau-b between measured and predicted values."""
    from scipy.stats import kendalltau

    return float(kendalltau(y, pred).statistic)


def spearman(y, pred) -> float:
    """Spearman's rank correlation between measured and predicted values."""
    from scipy.stats import spearmanr

    return float(spearmanr(y, pred).statistic)


def mae(y, pred) -> float:
    return float(np.mean(np.abs(np.asarray(y, dtype=float) - np.asarray(pred, dtype=float))))


def top_precision(y, pred, fraction: float = 0.1) -> float:
    """Share of the predicted top `fraction` (highest values) that is in the measured top `fraction`."""
    y, pred = np.asarray(y, dtype=float), np.asarray(pred, dtype=float)
    k = max(1, int(round(fraction * len(y))))
    true_top = set(np.argsort(-y, kind="stable")[:k].tolist())
    pred_top = np.argsort(-pred, kind="stable")[:k]
    return sum(int(i) in true_top for i in pred_top) / k


def report(y, pred) -> dict:
    """Every metric of one target, as the CLI prints and cards store them."""
    return {"kendall_tau": kendall_tau(y, pred), "spearman": spearman(y, pred), "mae": mae(y, pred),
            "top10_precision": top_precision(y, pred, 0.1), "rows": int(len(y))}


def reports(Y, pred, targets) -> dict:
    """`report` of every target column: {target: {metric: value}}."""
    Y, pred = np.asarray(Y).reshape(len(Y), -1), np.asarray(pred).reshape(len(pred), -1)
    return {t: report(Y[:, i], pred[:, i]) for i, t in enumerate(targets)}


def cross_validated(make, archs, Y, folds: int, seed: int) -> np.ndarray:
    """Out-of-fold predictions of a `folds`-fold cross-validation (rows shuffled from
    `seed`): each row predicted by a fresh `make()` predictor fitted on the other folds."""
    order = np.random.default_rng(seed).permutation(len(archs))
    pred = np.zeros(np.shape(Y))
    for fold in np.array_split(order, folds):
        rest = np.setdiff1d(order, fold)
        model = make().fit([archs[i] for i in rest], Y[rest])
        pred[fold] = model.predict([archs[i] for i in fold])[0]
    return pred
