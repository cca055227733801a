"""Surrogate-assisted search: a predictor, refit every generation on the trials so far,
screens the strategy's proposals so that only the most promising get real evaluation.

What training tells about an architecture - its accuracy and, in spaces with early
exits, the share of inputs leaving at each exit - is predicted; the costs that follow
from those exit rates are computed exactly on the device.  Of each batch the strategy
proposes, one candidate in `screen` is evaluated for real: the feasible ones first,
then those that fewest architectures dominate (the trials so far and the batch's
predictions together).  The strategy is told real values for those and predicted values
for the rest, so it runs `screen` times as many generations for the same budget.  Each
refit is logged (`surrogate.csv` in the run folder) with the Kendall tau between
predicted and real accuracy on the batch it screened in, and over every candidate
screened in so far.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from .objectives import minimisation_matrix
from .spaces.base import Arch, SearchSpace
from .store import append_csv, cell

# Real evaluations per refit at most, for strategies whose batch is as large as asked.
REAL_PER_REFIT = 5
LOG_COLUMNS = ("worker", "refit", "trials", "proposed", "evaluated", "kendall_tau", "kendall_tau_so_far", "fit_s")


class Surrogate:
    """Predicts an architecture's accuracy and exit rates from the trials so far.

    One predictor of `kind` (any of `nasctl predictor models`) per target: accuracy, and
    the rate of each early exit the space has (the final classifier takes the rest)."""

    def __init__(self, kind: str, space: SearchSpace, seed: int, warmup: int = 10):
        self.kind, self.space, self.seed, self.warmup = kind, space, seed, warmup
        self.targets = ["accuracy", *(f"exit_rate_{e}" for e in space.exit_names()[:-1])]
        self.models: dict = {}
        self.refits = 0

    def ready(self, n_trials: int) -> bool:
        return n_trials >= self.warmup

    def ask_size(self, n_trials: int, remaining: int, screen: int) -> int:
        """How many candidates to ask the strategy for: up to the warm-up's trials before
        the first fit; then `screen` per real evaluation, `REAL_PER_REFIT` real evaluations
        per refit at most."""
        if not self.ready(n_trials):
            return min(remaining, self.warmup - n_trials)
        return screen * min(remaining, REAL_PER_REFIT)

    def refit(self, rows: Sequence[dict]) -> None:
        """Fit every target on these finished trials (`arch` as a dict, target columns)."""
        from .predictors import make_predictor

        archs = [self.space.parse_arch(r["arch"]) for r in rows]
        self.models = {t: make_predictor(self.kind, self.space, seed=self.seed + self.refits).fit(
            archs, np.array([float(r[t]) for r in rows])) for t in self.targets}
        self.refits += 1

    def predict(self, archs: Sequence[Arch]) -> list[tuple[float, list[float]]]:
        """Per architecture: predicted accuracy and exit rates over its active exits (final last)."""
        pred = {t: m.predict(archs)[0] for t, m in self.models.items()}
        out = []
        for i, arch in enumerate(archs):
            early = [min(max(float(pred[f"exit_rate_{e}"][i]), 0.0), 1.0) for e in self.space.active_exits(arch)[:-1]]
            if sum(early) > 1.0:
                early = [p / sum(early) for p in early]
            out.append((float(pred["accuracy"][i]), [*early, 1.0 - sum(early)]))
        return out


def choose(predicted: Sequence[dict], archive: Sequence[dict], objectives: Sequence[str],
           violations: Sequence[float], k: int) -> list[int]:
    """Indices of the `k` predicted rows to evaluate for real: least constraint violation
    first, then fewest rows dominating them (the archive's real rows and the other
    predicted ones), then the order the strategy proposed them in."""
    F = minimisation_matrix(predicted, objectives)
    pool = np.vstack([F, minimisation_matrix(archive, objectives)]) if archive else F
    dominated_by = [int(np.sum(np.all(pool <= f, axis=1) & np.any(pool < f, axis=1))) for f in F]
    order = sorted(range(len(predicted)), key=lambda i: (max(violations[i], 0.0), dominated_by[i], i))
    return order[:k]


def n_real(proposed: int, screen: int) -> int:
    """Real evaluations for a batch of `proposed` new candidates."""
    return math.ceil(proposed / screen)


def batch_tau(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Kendall tau between real and predicted values of (real, predicted) pairs, or None
    where it is undefined (fewer than 2 pairs, or constant values)."""
    from .predictors.metrics import kendall_tau

    real, predicted = np.array(pairs, dtype=float).reshape(-1, 2).T
    if len(real) < 2 or np.ptp(predicted) == 0 or np.ptp(real) == 0:
        return None
    return kendall_tau(real, predicted)


def log_refit(run_dir: Path, **row) -> None:
    """One line of `surrogate.csv` in the run folder."""
    append_csv(run_dir / "surrogate.csv", [cell(row[c]) for c in LOG_COLUMNS], header=LOG_COLUMNS)
