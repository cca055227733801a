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
