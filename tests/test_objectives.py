import numpy as np
import pytest

from nasctl.errors import UsageError
from nasctl.objectives import Constraint, check_objectives, minimisation_matrix, pareto_mask


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
