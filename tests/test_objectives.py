import numpy as np
import pytest

from nasctl.errors import UsageError
from nasctl.objectives import (CONSTRAINT_METRICS, METRIC_TABLE, METRICS, Constraint, check_objectives, metric,
                               minimisation_matrix, objectives_help, pareto_front, pareto_mask)

ALL = [m.name for m in METRIC_TABLE]


def test_pareto_mask_hand_example():
    # (accuracy ↑, edp ↓)
    rows = [{"accuracy": 90, "edp": 5.0}, {"accuracy": 95, "edp": 9.0}, {"accuracy": 89, "edp": 6.0},
            {"accuracy": 80, "edp": 1.0}, {"accuracy": 95, "edp": 9.0}, {"accuracy": 94, "edp": 9.5}]
    F = minimisation_matrix(rows, ["accuracy", "edp"])
    assert F[0].tolist() == [-90, 5.0]
    assert pareto_mask(F).tolist() == [True, True, False, True, True, False]


def test_pareto_front_is_mutually_non_dominated():
    F = np.random.default_rng(0).random((200, 3))
    front = F[pareto_mask(F)]
    for a in front:
        assert not np.any(np.all(front <= a, axis=1) & np.any(front < a, axis=1))


def test_constraint_violation_sign():
    c = Constraint("latency_ms", 2.0)
    assert c.violation({"latency_ms": 1.5}) < 0
    assert c.violation({"latency_ms": 2.0}) == 0
    assert c.violation({"latency_ms": 3.0}) == pytest.approx(0.5)


@pytest.mark.parametrize("names", [["accuracy"], ["accuracy", "speed"], ["edp", "edp"]])
def test_bad_objectives(names):
    with pytest.raises(UsageError):
        check_objectives(names)


def test_a_lower_bound_constraint():
    from nasctl.objectives import Constraint

    floor = Constraint("accuracy", 90.0, lower=True)
    assert str(floor) == "accuracy >= 90"
    assert floor.violation({"accuracy": 95.0}) < 0 and floor.violation({"accuracy": 90.0}) == 0
    assert floor.violation({"accuracy": 81.0}) == pytest.approx(0.1)
    assert floor.best([{"accuracy": 81.0}, {"accuracy": 85.0}]) == 85.0


# ------------------------------------------------------------------ the metric table


def test_metrics_and_constraint_metrics_keep_their_meaning():
    # engine.py reads these two: name -> direction, flag -> the metric it bounds from above
    assert METRICS == {"accuracy": "max", "latency_ms": "min", "energy_mj": "min", "edp": "min", "params": "min",
                       "macs": "min", "weight_kib": "min", "exit_overhead": "min", "dynamic_efficiency": "max",
                       "area_mm2": "min"}
    assert CONSTRAINT_METRICS == {"max_latency_ms": "latency_ms", "max_energy_mj": "energy_mj",
                                  "max_params": "params", "max_weight_kib": "weight_kib"}
    assert len(set(ALL)) == len(ALL)


@pytest.mark.parametrize("name", ALL)
def test_every_metric_is_optimised_in_its_direction(name):
    m = metric(name)
    assert m.direction in ("max", "min") and METRICS[name] == m.direction
    rows = [{name: 1.0, "feasible": True, "trial": 0}, {name: 2.0, "feasible": True, "trial": 1}]
    F = minimisation_matrix(rows, [name])
    better = 1 if m.higher_is_better else 0
    assert F[better, 0] < F[1 - better, 0]
    partner = "edp" if name != "edp" else "accuracy"
    assert check_objectives([name, partner]) == [name, partner]
    # one row better in this metric, equal in the other: it alone is the front
    rows = [{**r, partner: 5.0} for r in rows]
    assert [r["trial"] for r in pareto_front(rows, [name, partner])] == [better]


@pytest.mark.parametrize("name", ALL)
def test_every_metric_has_a_display_and_its_help(name):
    from nasctl.config import SearchConfig

    m = metric(name)
    assert m.label and m.scale > 0 and m.arrow == ("↑" if m.direction == "max" else "↓")
    shown = m.format(1.0)
    assert shown.endswith(f" {m.unit}") if m.unit else shown == "1"
    assert m.format(1.0, unit=False) == format(m.scale, ",.0f" if not m.unit or m.scale >= 1e4 else ".4g")
    assert m.format(None) == "-"
    assert m.heading.startswith(m.label) and m.unit in m.heading
    assert m.label in m.axis_label and ("higher" if m.higher_is_better else "lower") in m.axis_label
    assert name in objectives_help()
    if m.limit_flag:  # a flag of `nasctl search`, bounding this metric
        assert CONSTRAINT_METRICS[m.limit_flag] == name and m.limit_flag in SearchConfig.model_fields


def test_an_unknown_metric_names_the_allowed_ones():
    with pytest.raises(UsageError, match="unknown metric 'speed'; allowed: accuracy, latency_ms"):
        metric("speed")
