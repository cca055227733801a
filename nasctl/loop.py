"""The search loop: ask → price → evaluate → record → tell, with surrogate screening.

This is the one loop every search runs: `nasctl search` (`engine.run_search`, trials in
the run's optuna study, candidates trained or looked up in tables) and the benchmarks
(trials in memory, answers from benchmark tables).  What differs is passed in:

- `evaluate(arch) -> row`: the candidate's trials.csv row (accuracy, costs, `feasible`),
  the expensive part (training).  It raises `Unpriced` when the candidate's cost cannot
  be computed (a latency table lacks it, the device cannot price one of its ops) before
  any training is spent; that failed trial does not count against the budget.  Any other
  exception is a failed trial that does count (a candidate that cannot be built or
  trained); the search goes on.
- `price(arch, accuracy, rates) -> row`: the same row from a predicted accuracy and exit
  rates, without training (screening).  It raises `Unpriced` like `evaluate`; screening
  ranks only candidates it can price.
- `trials`: where trials are recorded (`store.TrialStore`, or `MemoryTrials`).

The strategy is told real values for evaluated candidates, predicted ones for those the
surrogate passed over, and the worst possible values for candidates that failed or
could not be priced, so that it learns not to propose their like.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from .objectives import Constraint, minimisation_matrix
from .spaces.base import SearchSpace, arch_key
from .strategies.base import FAILED_PENALTY

# How many rounds in a row a strategy may propose only candidates already evaluated.
MAX_STALLED_ROUNDS = 50


class Unpriced(Exception):
    """A candidate's cost cannot be computed: it fails before any training."""


class Trials(Protocol):
    """Where a search records its trials (see `store.TrialStore`, `MemoryTrials`)."""

    def n_claimed(self) -> int: ...
    def finished_rows(self) -> list[dict]: ...
    def failed_keys(self) -> set[str]: ...
    def start(self, arch: dict, key: str, budget: int | None = None): ...
    def finish(self, trial, row: dict, values: Sequence[float], violations: dict[str, float]) -> int: ...
    def fail(self, trial, reason: str, *, counts: bool = True) -> None: ...
    def stop(self, trial) -> None: ...


class MemoryTrials:
    """Trials kept in memory, numbered in the order they end (benchmarks, tests)."""

    def __init__(self):
        self._rows: list[dict] = []
        self._failed: dict[str, tuple[str, bool]] = {}  # key -> (reason, counts against the budget)
        self._running: set[str] = set()
        self._number = 0

    def n_claimed(self) -> int:
        return len(self._rows) + len(self._running) + sum(counts for _, counts in self._failed.values())

    def finished_rows(self) -> list[dict]:
        return list(self._rows)

    def failed_keys(self) -> set[str]:
        return set(self._failed)

    def failures(self) -> list[str]:
        return [reason for reason, _ in self._failed.values()]

    def start(self, arch: dict, key: str, budget: int | None = None) -> str:
        self._running.add(key)  # one process: the loop's own check keeps to the budget
        return key

    def _end(self, key: str) -> int:
        self._running.discard(key)
        self._number += 1
        return self._number - 1

    def finish(self, key: str, row: dict, values: Sequence[float], violations: dict[str, float]) -> int:
        number = self._end(key)
        self._rows.append({**row, "trial": number})
        return number

    def fail(self, key: str, reason: str, *, counts: bool = True) -> None:
        self._end(key)
        self._failed[key] = (reason, counts)

    def stop(self, key: str) -> None:
        self._running.discard(key)


@dataclass
class _Screening:
    chosen: dict[str, float]    # key -> predicted accuracy, of the candidates to evaluate
    skipped: dict[str, dict]    # key -> predicted trials.csv row, of the priced others
    unpriced: dict[str, str]    # key -> why its cost cannot be computed
    trials: int                 # finished trials the surrogate was fitted on
    fit_s: float


def failure_kind(error: BaseException) -> str:
    """A short reason for a failed trial, the same for candidates that failed alike."""
    if isinstance(error, Unpriced):
        return f"cannot be priced: {error}"
    text = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {text}"[:300]


def search_loop(space: SearchSpace, strategy, trials: Trials, evaluate: Callable[[dict], dict],
                price: Callable[[dict, float, list[float]], dict], *, objectives: Sequence[str],
                constraints: Sequence[Constraint], budget: int, surrogate=None, screen: int = 5,
                on_trial: Callable[[dict, int], None] | None = None,
                on_refit: Callable[[dict], None] | None = None) -> None:
    """Ask `strategy` for candidates until `trials` holds `budget` claimed trials (or the
    strategy has proposed nothing new for `MAX_STALLED_ROUNDS` rounds).  With a
    `surrogate.Surrogate`, after its warm-up the strategy proposes `screen` candidates per
    real evaluation and the surrogate picks which to evaluate.  `strategy` is set up
    already.  `on_trial(row, n_finished)` follows each finished trial; `on_refit(entry)`
    each screening (one line of surrogate.csv)."""
    from .surrogate import batch_tau

    screened: list[tuple[float, float]] = []  # (real, predicted) accuracy of every screened-in trial
    # Candidates the surrogate passed over: reconsidered at every refit (strategies do not
    # propose an architecture twice, so they would otherwise be lost to the search).
    passed_over: dict[str, dict] = {}
    unpriced: set[str] = set()  # screened candidates whose cost cannot be computed
    seen = {row["arch"]: row for row in trials.finished_rows()}
    failed = trials.failed_keys()
    stalled = 0
    while (claimed := trials.n_claimed()) < budget and stalled < MAX_STALLED_ROUNDS:
        ready = surrogate is not None and surrogate.ready(len(seen))
        n = surrogate.ask_size(len(seen), budget - claimed, screen) if surrogate else budget - claimed
        archs = [space.validate(a) for a in strategy.ask(n)]
        if not archs and not (ready and passed_over):
            break
        keys = [arch_key(a) for a in archs]
        new = {k: a for k, a in zip(keys, archs) if k not in seen and k not in failed and k not in unpriced}
        candidates = dict(new)
        if ready:
            candidates.update((k, a) for k, a in passed_over.items() if k not in candidates and k not in seen)
        screening = None
        if ready and candidates:
            screening = _screen(surrogate, price, candidates, seen, objectives, constraints,
                                surrogate.n_real(len(candidates), screen))
            unpriced.update(screening.unpriced)
        skipped = screening.skipped if screening else {}
        passed_over = {k: a for k, a in candidates.items() if k in skipped}
        evaluated = 0
        for key, arch in candidates.items():
            if key in skipped or key in unpriced or trials.n_claimed() >= budget:
                continue
            trial = trials.start(arch, key, budget)
            if trial is None:  # the budget is spent, or another worker has it (its result, if
                # finished, is told as ours)
                seen.update((r["arch"], r) for r in trials.finished_rows() if r["arch"] not in seen)
                continue
            try:
                row = evaluate(arch)
            except (KeyboardInterrupt, SystemExit):
                trials.stop(trial)
                raise
            except Unpriced as e:
                trials.fail(trial, failure_kind(e), counts=False)
                failed.add(key)
                continue
            except Exception as e:  # noqa: BLE001 - one candidate that cannot be built or trained
                trials.fail(trial, failure_kind(e))
                failed.add(key)
                evaluated += 1
                continue
            evaluated += 1
            values = [row[o] for o in objectives]
            number = trials.finish(trial, row, values, {str(c): c.violation(row) for c in constraints})
            row = {"trial": number, **row}
            seen[key] = row
            if on_trial:
                on_trial(row, len(seen))
        if screening:
            batch = [(seen[k]["accuracy"], acc) for k, acc in screening.chosen.items() if k in seen]
            screened += batch
            if on_refit:
                on_refit({"refit": surrogate.refits, "trials": screening.trials, "proposed": len(new),
                          "evaluated": len(batch), "unpriced": len(screening.unpriced),
                          "kendall_tau": batch_tau(batch), "kendall_tau_so_far": batch_tau(screened),
                          "fit_s": screening.fit_s})
        if archs:
            tell(strategy, archs, [seen.get(k) or skipped.get(k) for k in keys], objectives, constraints)
        stalled = 0 if evaluated else stalled + 1


def _screen(surrogate, price, candidates: dict[str, dict], seen: dict, objectives: Sequence[str],
            constraints: Sequence[Constraint], n_pick: int) -> _Screening:
    """Refit the surrogate and split the candidates it can price into the `n_pick` to
    evaluate for real and the others, with their predicted rows."""
    from .surrogate import choose

    t0 = time.perf_counter()
    surrogate.refit(list(seen.values()))
    fit_s = round(time.perf_counter() - t0, 3)
    rows, unpriced = {}, {}
    for (key, arch), (accuracy, rates) in zip(candidates.items(), surrogate.predict(list(candidates.values()))):
        try:
            rows[key] = price(arch, accuracy, rates)
        except Unpriced as e:
            unpriced[key] = failure_kind(e)
    keys = list(rows)
    pick = choose([rows[k] for k in keys], list(seen.values()), objectives,
                  [sum(max(c.violation(rows[k]), 0.0) for c in constraints) for k in keys], n_pick)
    chosen = {keys[i]: rows[keys[i]]["accuracy"] for i in pick}
    return _Screening(chosen, {k: r for k, r in rows.items() if k not in chosen}, unpriced, len(seen), fit_s)


def tell(strategy, archs: list[dict], rows: list[dict | None], objectives: Sequence[str],
         constraints: Sequence[Constraint]) -> None:
    """Report each architecture's row; one without a row (failed, or not priced) gets the
    worst values."""
    F = np.full((len(archs), len(objectives)), FAILED_PENALTY)
    G = np.ones((len(archs), len(constraints)))
    ok = [i for i, r in enumerate(rows) if r is not None]
    if ok:
        F[ok] = minimisation_matrix([rows[i] for i in ok], objectives)
        G[ok] = [[c.violation(rows[i]) for c in constraints] for i in ok]
    strategy.tell(archs, F, G)


def summarise_failures(reasons: Sequence[str], limit: int = 3) -> str:
    """'N failed: REASON (n), ...' over the most common reasons, or '' where none failed."""
    if not reasons:
        return ""
    counts = Counter(_reason_class(r) for r in reasons)
    top = "; ".join(f"{reason} (x{n})" for reason, n in counts.most_common(limit))
    more = f"; {len(counts) - limit} other reason(s)" if len(counts) > limit else ""
    return f"{len(reasons)} trial(s) failed: {top}{more}"


def _reason_class(reason: str) -> str:
    """A reason without the architecture it names (a JSON object), so alike failures group."""
    start = reason.find("{")
    end = reason.rfind("}")
    return reason[:start].rstrip() + " ..." + reason[end + 1:] if 0 <= start < end else reason
