"""Surrogate-assisted search: a predictor, refit every generation on the trials so far,
screens the strategy's proposals so that only the most promising get real evaluation.

What training tells about an architecture - its accuracy and, in spaces with early
exits, the share of inputs leaving at each exit - is predicted; the costs that follow
from those exit rates are computed exactly on the device.  After a warm-up of the
strategy's own proposals, one candidate in `screen` is evaluated for real: the feasible
ones first, then by non-dominated layer (the trials so far and the predictions sorted
together), accuracy predicted optimistically where the model has a spread.  Candidates
passed over are reconsidered, with the refit predictor, at every later refit (the
engine keeps them).  The strategy is told real values for those evaluated and predicted
values (as ranked) for the rest, so it runs `screen` times as many generations for the
same budget.  Each refit is logged (`surrogate.csv` in the run folder) with the Kendall
tau between predicted (as ranked) and real accuracy on the batch it screened in, and
over every candidate screened in so far.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import UsageError
from .objectives import minimisation_matrix
from .spaces.base import Arch, SearchSpace
from .store import append_csv, cell
from .strategies.base import one_thread

# Least warm-up (real evaluations before the first fit) and batch (real evaluations per refit).
MIN_WARMUP, MIN_BATCH = 10, 5
LOG_COLUMNS = ("worker", "refit", "trials", "proposed", "evaluated", "unpriced", "kendall_tau", "kendall_tau_so_far",
               "fit_s")


def outcome_targets(space: SearchSpace) -> list[str]:
    """The trials.csv columns training decides: accuracy, and each early exit's rate."""
    return ["accuracy", *(f"exit_rate_{e}" for e in space.exit_names()[:-1])]


class Outcomes:
    """What training would tell about architectures - accuracy, and the share of inputs
    leaving at each active exit (final classifier last) - from a predictor of `targets`
    (trials.csv column names; a predictor of one target predicts accuracy, whatever its
    column was called).  An exit whose rate it does not predict is never taken (its
    inputs go on to the next exit)."""

    def __init__(self, space: SearchSpace, predictor, targets: Sequence[str]):
        if len(targets) == 1:
            targets = ["accuracy"]
        if "accuracy" not in targets:
            raise UsageError(f"the predictor predicts {', '.join(targets)}; an accuracy source needs one that "
                             "predicts 'accuracy' (train it with --target accuracy,...)")
        self.space, self.predictor, self.targets = space, predictor, list(targets)

    @classmethod
    def saved(cls, name: str, space: SearchSpace) -> "Outcomes":
        """From a predictor saved by `nasctl predictor train` (its card names the targets)."""
        from .predictors import load_predictor
        from .predictors.store import find, read_card

        predictor = load_predictor(name, space=space)
        return cls(space, predictor, read_card(find(name)).get("target") or ["accuracy"])

    def __call__(self, archs: Sequence[Arch], optimism: float = 0.0) -> list[tuple[float, list[float]]]:
        """Each architecture's (accuracy, exit rates).  With `optimism`, accuracy is the
        prediction that many standard deviations above the mean on the predictor's scale
        (models with a spread; see `Predictor.predict`)."""
        shift = [optimism if t == "accuracy" else 0.0 for t in self.targets]
        mean = np.asarray(self.predictor.predict(archs, shift)[0], dtype=float).reshape(len(archs), -1)
        column = dict(zip(self.targets, mean.T))
        out = []
        for i, arch in enumerate(archs):
            early = [min(max(float(column[f"exit_rate_{e}"][i]), 0.0), 1.0) if f"exit_rate_{e}" in column else 0.0
                     for e in self.space.active_exits(arch)[:-1]]
            if sum(early) > 1.0:
                early = [p / sum(early) for p in early]
            out.append((float(column["accuracy"][i]), [*early, 1.0 - sum(early)]))
        return out


class Surrogate:
    """Predicts an architecture's accuracy and exit rates from the trials so far, with a
    predictor of model `kind` (any of `nasctl predictor models`) fitted to all of them.

    Of a search's `budget` real evaluations, the first `warmup` (a sixth of the budget,
    at least 10) go to the strategy's own proposals; after that the predictor is refit
    every `batch` (a twelfth of the budget, at least 5) real evaluations.  Screening
    ranks candidates by their accuracy predicted `optimism` standard deviations above
    the mean (models with a spread), so that the uncertain ones get their chance."""

    def __init__(self, kind: str, space: SearchSpace, seed: int, budget: int, optimism: float = 0.5):
        self.kind, self.space, self.seed, self.optimism = kind, space, seed, optimism
        self.warmup = max(MIN_WARMUP, round(budget / 6))
        self.batch = self.batch_size(budget)
        self.targets = outcome_targets(space)
        self._outcomes: Outcomes | None = None
        self.refits = 0

    @staticmethod
    def batch_size(budget: int) -> int:
        """Real evaluations between two refits, for a search of `budget` of them."""
        return max(MIN_BATCH, round(budget / 12))

    def ready(self, n_trials: int) -> bool:
        return n_trials >= self.warmup

    def ask_size(self, n_trials: int, remaining: int, screen: int) -> int:
        """How many candidates to ask the strategy for: up to the warm-up's trials before
        the first fit; then `screen` per real evaluation of the next batch."""
        if not self.ready(n_trials):
            return min(remaining, self.warmup - n_trials)
        return screen * min(remaining, self.batch)

    def n_real(self, candidates: int, screen: int) -> int:
        """Real evaluations for a refit screening `candidates`: one per `screen` of them,
        at least one, at most a batch."""
        return min(self.batch, max(1, math.ceil(candidates / screen)))

    @one_thread
    def refit(self, rows: Sequence[dict]) -> None:
        """Fit the targets on these finished trials (`arch` key, target columns); then
        `predict(archs)` gives each one's accuracy and exit rates."""
        from .predictors import make_predictor

        archs = [self.space.parse_arch(r["arch"]) for r in rows]
        Y = np.array([[float(r[t]) for t in self.targets] for r in rows])
        predictor = make_predictor(self.kind, self.space, seed=self.seed + self.refits).fit(archs, Y)
        self._outcomes = Outcomes(self.space, predictor, self.targets)
        self.refits += 1

    @one_thread
    def predict(self, archs: Sequence[Arch]) -> list[tuple[float, list[float]]]:
        """Each architecture's (optimistic) accuracy and exit rates, by the last refit."""
        return self._outcomes(archs, self.optimism)


def choose(predicted: Sequence[dict], archive: Sequence[dict], objectives: Sequence[str],
           violations: Sequence[float], k: int) -> list[int]:
    """Indices of the `k` predicted rows to evaluate for real: least constraint violation
    first, then the non-dominated layer they lie in (the archive's real rows and the
    predicted ones sorted together; the first front is layer 0), then the order the
    strategy proposed them in."""
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting

    F = minimisation_matrix(predicted, objectives)
    pool = np.vstack([F, minimisation_matrix(archive, objectives)]) if archive else F
    layer = np.empty(len(pool), dtype=int)
    for i, front in enumerate(NonDominatedSorting().do(pool)):
        layer[front] = i
    order = sorted(range(len(predicted)), key=lambda i: (max(violations[i], 0.0), layer[i], i))
    return order[:k]


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
