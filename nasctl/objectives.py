"""Objectives, constraints and Pareto helpers.

`METRIC_TABLE` is the one list of the metrics a search can optimise: the trials.csv
column, which way is better, and how it is shown (label, on-screen unit and the factor
from the trials.csv unit). Objectives, constraints, `runs show`/`list`/`compare`, plots,
reports and the `--objectives` help all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .errors import UsageError


@dataclass(frozen=True)
class Metric:
    """One metric column of trials.csv."""

    name: str                      # the trials.csv column, as --objectives names it
    direction: str                 # "max" or "min": which way is better
    label: str                     # what tables, plots and reports call it
    unit: str                      # its on-screen unit ("" for a count)
    scale: float                   # on-screen value = trials.csv value * scale
    csv_unit: str                  # its unit in trials.csv ("" for a count, "share" for 0..1)
    limit_flag: str | None = None  # the search flag bounding it from above, if any
    energy: bool = False           # only devices that model energy measure it
    needs: str = ""                # any other setting a search needs to measure it

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "max"

    @property
    def arrow(self) -> str:
        return "↑" if self.higher_is_better else "↓"

    @property
    def heading(self) -> str:
        """A column heading: label and on-screen unit, e.g. `EDP µJ·µs`."""
        return f"{self.label} {self.unit}" if self.unit else self.label

    @property
    def axis_label(self) -> str:
        unit = f" ({self.unit})" if self.unit else ""
        return f"{self.label}{unit}, {'higher' if self.higher_is_better else 'lower'} is better"

    def format(self, value: float, unit: bool = True) -> str:
        """A trials.csv value in its on-screen unit: `3.76 µJ·µs`, `30,020 µs` (not
        3.002e+04), `585,466` for a count; `-` for a missing value."""
        if value is None:
            return "-"
        v = value * self.scale
        text = f"{v:,.0f}" if not self.unit or abs(v) >= 1e4 else f"{v:.4g}"
        return f"{text} {self.unit}" if self.unit and unit else text


METRIC_TABLE: tuple[Metric, ...] = (
    Metric("accuracy", "max", "accuracy", "%", 1.0, "%"),
    Metric("latency_ms", "min", "latency", "µs", 1e3, "ms", limit_flag="max_latency_ms"),
    Metric("energy_mj", "min", "energy", "µJ", 1e3, "mJ", limit_flag="max_energy_mj", energy=True),
    Metric("edp", "min", "EDP", "µJ·µs", 1e6, "mJ·ms", energy=True),
    Metric("params", "min", "parameters", "", 1.0, "", limit_flag="max_params"),
    Metric("macs", "min", "MACs", "", 1.0, ""),
    Metric("weight_kib", "min", "weights", "KiB", 1.0, "KiB", limit_flag="max_weight_kib"),
    Metric("exit_overhead", "min", "exit overhead", "%", 100.0, "share", energy=True),
    Metric("dynamic_efficiency", "max", "dynamic efficiency", "%", 100.0, "share", energy=True),
    Metric("area_mm2", "min", "area", "mm²", 1.0, "mm²", needs="--co-search"),
)
_BY_NAME = {m.name: m for m in METRIC_TABLE}

# Metric columns of trials.csv a search can optimise, and which way is better.
METRICS = {m.name: m.direction for m in METRIC_TABLE}
# Constraint flags: an upper bound on a metric.
CONSTRAINT_METRICS = {m.limit_flag: m.name for m in METRIC_TABLE if m.limit_flag}


def metric(name: str) -> Metric:
    """The METRIC_TABLE entry of `name`; a UsageError naming the allowed ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UsageError(f"unknown metric '{name}'; allowed: {', '.join(METRICS)}") from None


def objectives_help() -> str:
    """The metrics as the `--objectives` help lists them, with trials.csv units."""
    def one(m: Metric) -> str:
        notes = ", ".join(n for n in (m.csv_unit, m.needs and f"with {m.needs}") if n)
        marks = (" ↑" if m.higher_is_better else "") + ("*" if m.energy else "")
        return f"{m.name}{marks}" + (f" ({notes})" if notes else "")

    return (", ".join(one(m) for m in METRIC_TABLE) + "; ↑: higher is better, the others lower; "
            "*: needs a device that models energy")


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
    sign = np.array([-1.0 if _BY_NAME[o].higher_is_better else 1.0 for o in objectives])
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
