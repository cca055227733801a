"""Objectives, constraints and Pareto helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .errors import UsageError

# Metric columns of trials.csv a search can optimise, and which way is better.
METRICS = {"accuracy": "max", "latency_ms": "min", "energy_mj": "min", "edp": "min",
           "params": "min", "macs": "min", "weight_kib": "min", "exit_overhead": "min", "dynamic_efficiency": "max",
           "area_mm2": "min"}
# Constraint flags: an upper bound on a metric.
CONSTRAINT_METRICS = {"max_latency_ms": "latency_ms", "max_energy_mj": "energy_mj", "max_params": "params",
                      "max_weight_kib": "weight_kib"}


def check_objectives(names: Sequence[str]) -> list[str]:
    names = list(names)
    for n in names:
        if n not in METRICS:
            raise UsageError(f"unknown objective '{n}'; allowed: {', '.join(METRICS)}")
    if len(names) < 2 or len(set(names)) != len(names):
        raise UsageError(f"objectives {','.join(names)}: give at least two different ones")
    return names


@dataclass(frozen=True)
class Constraint:
    metric: str
    limit: float | str  # a bound, or the row column holding each candidate's own bound
    lower: bool = False  # the limit is a lower bound (metric >= limit)

    def __str__(self) -> str:
        limit = self.limit if isinstance(self.limit, str) else format(self.limit, "g")
        return f"{self.metric} {'>=' if self.lower else '<='} {limit}"

    def violation(self, row: Mapping[str, float]) -> float:
        """<= 0 where met; relative excess beyond the limit otherwise."""
        limit = row[self.limit] if isinstance(self.limit, str) else self.limit
        excess = limit - row[self.metric] if self.lower else row[self.metric] - limit
        return excess / max(abs(limit), 1e-12)

    def best(self, rows: Sequence[Mapping[str, float]]) -> float:
        """The value closest to meeting it among `rows`."""
        return (max if self.lower else min)(r[self.metric] for r in rows)


def minimisation_matrix(rows: Sequence[Mapping[str, float]], objectives: Sequence[str]) -> np.ndarray:
    """Objective values with maximised metrics negated, so smaller is better throughout."""
    sign = np.array([-1.0 if METRICS[o] == "max" else 1.0 for o in objectives])
    return np.array([[float(r[o]) for o in objectives] for r in rows], dtype=float).reshape(-1, len(objectives)) * sign


def pareto_mask(F: np.ndarray) -> np.ndarray:
    """True for rows of F (minimisation) that no other row dominates; equal rows are all kept."""
    F = np.asarray(F, dtype=float)
    n = len(F)
    mask = np.ones(n, dtype=bool)
    for i in range(n):
        dominated = np.all(F <= F[i], axis=1) & np.any(F < F[i], axis=1)
        mask[i] = not dominated.any()
    return mask


def pareto_front(rows: list[dict], objectives: list[str]) -> list[dict]:
    """The non-dominated feasible rows, best first by the first objective."""
    feasible = [r for r in rows if r["feasible"]]
    if not feasible:
        return []
    F = minimisation_matrix(feasible, objectives)
    mask = pareto_mask(F)
    order = sorted(range(len(feasible)), key=lambda i: tuple(F[i]))
    return [feasible[i] for i in order if mask[i]]
