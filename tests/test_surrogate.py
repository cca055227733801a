"""The surrogate's pieces: which screened candidates get real evaluation, and predicted
exit rates that make a valid distribution over each architecture's exits."""

import numpy as np
import pytest

from nasctl.spaces.base import arch_key
from nasctl.spaces.loader import load_space
from nasctl.surrogate import Surrogate, batch_tau, choose


def test_choose_prefers_feasible_then_earliest_layer_then_proposal_order():
    objectives = ["accuracy", "latency_ms"]
    archive = [{"accuracy": 90.0, "latency_ms": 2.0}]
    predicted = [
        {"accuracy": 85.0, "latency_ms": 3.0},  # dominated by the archive point and by candidate 2
        {"accuracy": 95.0, "latency_ms": 1.0},  # dominates everything, but infeasible
        {"accuracy": 91.0, "latency_ms": 2.0},  # non-dominated
        {"accuracy": 89.0, "latency_ms": 1.5},  # non-dominated
    ]
    violations = [0.0, 0.3, 0.0, 0.0]
    assert choose(predicted, archive, objectives, violations, 2) == [2, 3]
    assert choose(predicted, archive, objectives, violations, 4) == [2, 3, 0, 1]


def test_choose_ranks_by_non_dominated_layer_not_by_how_many_dominate():
    objectives = ["accuracy", "latency_ms"]
    first = [(95.0, 3.0), (94.0, 2.0), (93.0, 1.0), (96.0, 6.0)]  # the front
    rows = [(95.2, 8.0),  # behind (96, 6) and (95.5, 7): third layer, two dominate it
            (92.0, 4.0),  # behind three front points: second layer
            *first, (95.5, 7.0)]  # (95.5, 7): second layer
    predicted = [{"accuracy": a, "latency_ms": t} for a, t in rows]
    assert choose(predicted, [], objectives, [0.0] * len(rows), len(rows)) == [2, 3, 4, 5, 1, 6, 0]


def test_warm_up_and_batch_follow_the_budget():
    space = load_space("nb201")
    small, large = Surrogate("ridge", space, 0, budget=20), Surrogate("ridge", space, 0, budget=300)
    assert (small.warmup, small.batch, large.warmup, large.batch) == (10, 5, 50, 25)
    assert not large.ready(49) and large.ready(50)
    assert large.ask_size(50, 250, screen=4) == 100 and large.ask_size(290, 10, screen=4) == 40
    assert [large.n_real(c, screen=4) for c in (1, 9, 100, 10_000)] == [1, 3, 25, 25]


def test_batch_tau_is_undefined_for_fewer_than_two_or_constant_values():
    assert batch_tau([(1.0, 2.0)]) is None
    assert batch_tau([(1.0, 2.0), (2.0, 2.0)]) is None
    assert batch_tau([(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)]) == pytest.approx(1 / 3)


def test_predicted_exit_rates_form_a_distribution_over_active_exits():
    space = load_space("ee-mbv2")
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(30):
        arch = space.sample(rng)
        active = space.active_exits(arch)
        rates = dict.fromkeys(space.exit_names(), 0.0)
        rates.update(zip(active, rng.dirichlet(np.ones(len(active)))))
        rows.append({"arch": arch_key(arch), "accuracy": rng.uniform(60, 95),
                     **{f"exit_rate_{e}": p for e, p in rates.items()}})
    surrogate = Surrogate("ridge", space, seed=0, budget=30)
    surrogate.refit(rows)
    archs = [space.sample(rng) for _ in range(50)]
    for arch, (accuracy, rates) in zip(archs, surrogate.predict(archs)):
        assert len(rates) == len(space.active_exits(arch))
        assert all(0 <= p <= 1 for p in rates) and sum(rates) == pytest.approx(1)
        assert np.isfinite(accuracy)
